python3 -m hazards.gates.synthlm.harness --out /tmp/lg --max-seconds 30
