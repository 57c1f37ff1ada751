/* A native program that hangs on the CPU: the main thread waits on a condition variable
 * nobody signals, in a function of its own (wait_for_flag); a second thread sleeps in a
 * loop. Built with -g by the tests; the native stacks must name wait_for_flag. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int flag = 0;

static void* sleeper(void* arg) {
  (void)arg;
  for (;;) usleep(50000);
  return NULL;
}

static void wait_for_flag(void) {
  pthread_mutex_lock(&lock);
  while (!flag) pthread_cond_wait(&cond, &lock); /* nobody ever signals: the hang */
  pthread_mutex_unlock(&lock);
}

int main(void) {
  pthread_t t;
  pthread_create(&t, NULL, sleeper, NULL);
  printf("HZ_HANG waiting\n");
  fflush(stdout);
  wait_for_flag();
  return 0;
}
