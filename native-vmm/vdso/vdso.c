/*
 * The guest's vDSO: clock_gettime, gettimeofday, time, clock_getres and getcpu answered inside
 * the VM, without a system call (a VM exit). Built by build.rs into a small ELF shared object
 * that the VMM places at layout::VDSO_ADDR and names in the auxiliary vector (AT_SYSINFO_EHDR);
 * glibc finds these functions by name and version (LINUX_2.6), as on Linux.
 *
 * Time comes from the TSC (the VMM makes the guest's TSC the host's) and the data page just
 * below the code (vdso::clock, the VMM's side of this layout), which the VMM keeps current:
 *
 *     ns(CLOCK_MONOTONIC) = mono_base + ((tsc - tsc_base) * mult) >> 32
 *
 * realtime and boottime add an offset. The page is read under a sequence count (odd while the
 * VMM writes it). When its mode is 0 (a VM whose TSC is not the host's, or a CPU that maps no
 * data page: the page then reads as zeros), and for every clock the page does not serve (the
 * CPU-time clocks among them: their time is the VMM's accounting), the function makes the
 * system call instead, so the answer is always the VMM's.
 */

typedef unsigned long u64;
typedef long s64;

struct timespec_ { s64 tv_sec; s64 tv_nsec; };
struct timeval_ { s64 tv_sec; s64 tv_usec; };

/* Must match vdso::clock::Word. */
struct vvar {
    u64 seq;
    u64 mode;
    u64 tsc_base;
    u64 mono_base;
    u64 mult;
    s64 real_offset;
    s64 boot_offset;
};

/* Placed one page below the vDSO's first byte by vdso.lds. */
extern const volatile struct vvar sandfork_vvar __attribute__((visibility("hidden")));

#define MODE_TSC 1
#define NSEC_PER_SEC 1000000000UL
#define COARSE_RESOLUTION_NS 4000000L

#define CLOCK_REALTIME 0
#define CLOCK_MONOTONIC 1
#define CLOCK_MONOTONIC_RAW 4
#define CLOCK_REALTIME_COARSE 5
#define CLOCK_MONOTONIC_COARSE 6
#define CLOCK_BOOTTIME 7

#define SYS_gettimeofday 96
#define SYS_time 201
#define SYS_clock_gettime 228
#define SYS_clock_getres 229

static long syscall2(long nr, long a, long b)
{
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b) : "rcx", "r11", "memory");
    return ret;
}

/* rdtsc ordered after the loads before it and before the loads after it. */
static inline u64 rdtsc_ordered(void)
{
    unsigned int lo, hi;
    __asm__ volatile("lfence; rdtsc; lfence" : "=a"(lo), "=d"(hi) : : "memory");
    return ((u64)hi << 32) | lo;
}

/* Nanoseconds of `clock` (one the page serves) into *ns; 0, or -1 when the page says: ask the VMM. */
static int read_clock(int clock, u64 *ns)
{
    const volatile struct vvar *v = &sandfork_vvar;
    for (;;) {
        u64 seq = v->seq;
        if (seq & 1) {
            __asm__ volatile("pause" ::: "memory");
            continue;
        }
        __asm__ volatile("" ::: "memory");
        if (v->mode != MODE_TSC)
            return -1;
        u64 tsc_base = v->tsc_base, mono = v->mono_base, mult = v->mult;
        s64 offset = 0;
        if (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)
            offset = v->real_offset;
        else if (clock == CLOCK_BOOTTIME)
            offset = v->boot_offset;
        u64 tsc = rdtsc_ordered();
        if (v->seq != seq)
            continue;
        u64 delta = tsc > tsc_base ? tsc - tsc_base : 0;
        *ns = mono + (u64)(((unsigned __int128)delta * mult) >> 32) + (u64)offset;
        return 0;
    }
}

static int served(int clock)
{
    switch (clock) {
    case CLOCK_REALTIME: case CLOCK_MONOTONIC: case CLOCK_MONOTONIC_RAW:
    case CLOCK_REALTIME_COARSE: case CLOCK_MONOTONIC_COARSE: case CLOCK_BOOTTIME:
        return 1;
    default:
        return 0;
    }
}

int __vdso_clock_gettime(int clock, struct timespec_ *ts)
{
    u64 ns;
    if (!served(clock) || read_clock(clock, &ns))
        return (int)syscall2(SYS_clock_gettime, clock, (long)ts);
    ts->tv_sec = (s64)(ns / NSEC_PER_SEC);
    ts->tv_nsec = (s64)(ns % NSEC_PER_SEC);
    return 0;
}

int __vdso_gettimeofday(struct timeval_ *tv, void *tz)
{
    u64 ns;
    if (read_clock(CLOCK_REALTIME, &ns))
        return (int)syscall2(SYS_gettimeofday, (long)tv, (long)tz);
    if (tv) {
        tv->tv_sec = (s64)(ns / NSEC_PER_SEC);
        tv->tv_usec = (s64)(ns % NSEC_PER_SEC / 1000);
    }
    if (tz) /* struct timezone: UTC, no DST, as the VMM answers */
        ((int *)tz)[0] = ((int *)tz)[1] = 0;
    return 0;
}

s64 __vdso_time(s64 *t)
{
    u64 ns;
    if (read_clock(CLOCK_REALTIME, &ns))
        return syscall2(SYS_time, (long)t, 0);
    s64 sec = (s64)(ns / NSEC_PER_SEC);
    if (t)
        *t = sec;
    return sec;
}

int __vdso_clock_getres(int clock, struct timespec_ *res)
{
    u64 ns;
    if (!served(clock) || read_clock(clock, &ns))
        return (int)syscall2(SYS_clock_getres, clock, (long)res);
    if (res) {
        res->tv_sec = 0;
        res->tv_nsec = (clock == CLOCK_REALTIME_COARSE || clock == CLOCK_MONOTONIC_COARSE) ? COARSE_RESOLUTION_NS : 1;
    }
    return 0;
}

/* The VM has one vCPU and one NUMA node. */
int __vdso_getcpu(unsigned *cpu, unsigned *node, void *unused)
{
    (void)unused;
    if (cpu)
        *cpu = 0;
    if (node)
        *node = 0;
    return 0;
}

int clock_gettime(int, struct timespec_ *) __attribute__((weak, alias("__vdso_clock_gettime")));
int gettimeofday(struct timeval_ *, void *) __attribute__((weak, alias("__vdso_gettimeofday")));
s64 time(s64 *) __attribute__((weak, alias("__vdso_time")));
int clock_getres(int, struct timespec_ *) __attribute__((weak, alias("__vdso_clock_getres")));
int getcpu(unsigned *, unsigned *, void *) __attribute__((weak, alias("__vdso_getcpu")));
