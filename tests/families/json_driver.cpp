// Test driver for standalone/common/json.h: one JSON text per stdin line; prints the
// re-serialised value, or "ERR <message>".
#include <iostream>
#include <string>

#include "../../standalone/common/json.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    hz::json::Value v;
    std::string err;
    if (hz::json::parse(line, v, err)) std::cout << hz::json::dump(v) << "\n";
    else std::cout << "ERR " << err << "\n";
  }
  return 0;
}
