/* Threads at the C level: pthread_create and join (clone3, CLONE_CHILD_CLEARTID and the futex
 * wake at exit), distinct tids, TLS per thread, a mutex and condition variable hand-off,
 * sched_yield, and a thread spinning in user code with no system call at all, which only
 * preemption lets the main thread stop. Prints one line per check. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static __thread int tls_value;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int turn, rounds = 1000;
static volatile int stop_spinning;
static volatile long spins;

static void *worker(void *arg) {
    tls_value = (int)(long)arg;
    sched_yield();
    long tid = syscall(SYS_gettid);
    return (void *)(tid * 100 + tls_value);
}

static void *ping(void *arg) {
    int me = (int)(long)arg;
    for (int i = 0; i < rounds; i++) {
        pthread_mutex_lock(&lock);
        while (turn != me)
            pthread_cond_wait(&cond, &lock);
        turn = 1 - me;
        pthread_cond_signal(&cond);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

static void *spin(void *arg) {
    (void)arg;
    while (!stop_spinning)
        spins++;
    return NULL;
}

int main(void) {
    pthread_t t[4];
    tls_value = 99;
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    int distinct = 1;
    long seen[4];
    for (int i = 0; i < 4; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        seen[i] = (long)ret;
        if (seen[i] % 100 != i || seen[i] / 100 == getpid())
            distinct = 0;
        for (int j = 0; j < i; j++)
            if (seen[j] / 100 == seen[i] / 100)
                distinct = 0;
    }
    printf("join tls tids: %d, main tls %d\n", distinct, tls_value);

    pthread_t a, b;
    pthread_create(&a, NULL, ping, (void *)0L);
    pthread_create(&b, NULL, ping, (void *)1L);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("ping-pong: %d rounds, turn %d\n", rounds, turn);

    pthread_t s;
    pthread_create(&s, NULL, spin, NULL);
    usleep(20000);
    stop_spinning = 1;
    pthread_join(s, NULL);
    printf("spinner stopped: %d\n", spins > 0);
    printf("tgkill self 0: %d\n", (int)syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), 0));
    return 0;
}
