/* The guest's vDSO clock (tests/vdso_kvm.rs, `sandfork-vmm bench syscalls`).
 *
 *   vdso_clock check N   N clock_gettime(CLOCK_MONOTONIC) through glibc (the vDSO) with a raw
 *                        syscall(SYS_clock_gettime) after every 100th, each read no earlier than
 *                        the one before; then prints "vdso <AT_SYSINFO_EHDR> realtime <ns>
 *                        monotonic <ns> gettimeofday <us> time <s> boottime <ns> getcpu <cpu>"
 *                        and "ok" (or what went backwards, exit 1).
 *   vdso_clock bench N   N getppid() system calls, then N clock_gettime(CLOCK_MONOTONIC)
 *                        calls through glibc, and prints {"syscall_ns": x, "clock_gettime_ns": y}
 *                        (mean nanoseconds per call, timed with CLOCK_MONOTONIC). */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long ns_of(const struct timespec *t) { return t->tv_sec * 1000000000LL + t->tv_nsec; }

static long long mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return ns_of(&t);
}

static int check(long n) {
    long long last = 0;
    for (long i = 0; i < n; i++) {
        long long now = mono();
        if (now < last) {
            printf("vdso monotonic went backwards at %ld: %lld after %lld\n", i, now, last);
            return 1;
        }
        last = now;
        if (i % 100 == 0) {
            struct timespec t;
            syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &t);
            if (ns_of(&t) < last) {
                printf("syscall monotonic went backwards at %ld: %lld after %lld\n", i, ns_of(&t), last);
                return 1;
            }
            last = ns_of(&t);
        }
    }
    struct timespec real, boot;
    struct timeval tv;
    clock_gettime(CLOCK_REALTIME, &real);
    gettimeofday(&tv, NULL);
    time_t seconds = time(NULL);
    clock_gettime(CLOCK_BOOTTIME, &boot);
    printf("vdso %#lx realtime %lld monotonic %lld gettimeofday %lld time %lld boottime %lld getcpu %d\n", getauxval(AT_SYSINFO_EHDR), ns_of(&real), mono(),
           tv.tv_sec * 1000000LL + tv.tv_usec, (long long)seconds, ns_of(&boot), sched_getcpu());
    printf("ok\n");
    return 0;
}

static int bench(long n) {
    long long start = mono();
    for (long i = 0; i < n; i++)
        syscall(SYS_getppid);
    long long middle = mono();
    for (long i = 0; i < n; i++)
        mono();
    long long end = mono();
    printf("{\"syscall_ns\": %.1f, \"clock_gettime_ns\": %.1f}\n", (double)(middle - start) / n, (double)(end - middle) / n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "check") == 0) return check(atol(argv[2]));
    if (argc == 3 && strcmp(argv[1], "bench") == 0) return bench(atol(argv[2]));
    fprintf(stderr, "usage: vdso_clock check|bench N\n");
    return 2;
}
