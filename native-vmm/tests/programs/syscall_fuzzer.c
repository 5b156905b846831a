/* The syscall-argument fuzzer's guest (tests/syscall_fuzz_kvm.rs): `syscall_fuzzer SEED COUNT`
 * makes COUNT system calls with numbers and arguments drawn from a xorshift generator seeded with
 * SEED, so one seed replays the same calls. Numbers: anything in 0..1023 (less the five calls
 * that end or stop every run), a few past Linux's range and
 * Sandfork's private agent calls. Arguments: pointers into the system area, just past mapped
 * memory (a page unmapped after a mapped one, the brk end), non-canonical and kernel addresses,
 * huge lengths, negative descriptors, small integers, random bits, and pointers into a scratch
 * buffer that the VMM may fill.
 *
 * After every call the scratch buffer is searched for "SFHOST::", the prefix of the secrets the
 * test plants in the VMM's own process (its environment, its heap, a host file): a call that
 * copied host data into the guest makes the program print what it found and exit 99. At the end
 * it prints how many calls returned each errno. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SCRATCH_BYTES (4 * 4096)
static unsigned char scratch[SCRATCH_BYTES] __attribute__((aligned(4096)));
static uint64_t state;
static unsigned errno_counts[4096];
static unsigned ok_count;

static uint64_t next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static long raw_syscall(uint64_t nr, const uint64_t a[6]) {
    long ret;
    register uint64_t r10 __asm__("r10") = a[3];
    register uint64_t r8 __asm__("r8") = a[4];
    register uint64_t r9 __asm__("r9") = a[5];
    __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a[0]), "S"(a[1]), "d"(a[2]), "r"(r10), "r"(r8), "r"(r9) : "rcx", "r11", "memory");
    return ret;
}

static uint64_t hole;   /* a page just past a mapped one, unmapped */
static uint64_t brk_end;

static uint64_t argument(void) {
    uint64_t r = next();
    switch (r % 16) {
    case 0: return 0x1000 + (next() % 0xFF000);                       /* system area */
    case 1: return hole + (next() % 4096);                            /* just past mapped memory */
    case 2: return hole - 1 - (next() % 64);                          /* straddling the hole's start */
    case 3: return brk_end + (next() % 8192);                         /* past the heap */
    case 4: return 0x8000000000000000ull | next();                    /* non-canonical */
    case 5: return 0xFFFF800000000000ull + (next() % 0x100000000ull); /* kernel half */
    case 6: return (uint64_t)1 << (next() % 64);                      /* huge lengths */
    case 7: return ~(uint64_t)0 - (next() % 4096);                    /* -1 .. -4096: negative fds, -errno */
    case 8: return next() % 8;                                        /* small integers: flags, fds 0..7 */
    case 9: return next() % 4096;
    case 10: return (uint64_t)(uintptr_t)(scratch + next() % SCRATCH_BYTES);
    case 11: return (uint64_t)(uintptr_t)scratch;
    case 12: return (uint64_t)(uintptr_t)(scratch + SCRATCH_BYTES - (next() % 16)); /* runs off its end */
    case 13: return (uint32_t)next();
    case 14: return 0;
    default: return next();
    }
}

static uint64_t number(void) {
    uint64_t r = next();
    if (r % 4096 == 0) return 0x53460000ull + (next() % 16); /* Sandfork's private calls: they stop a program that is no agent */
    switch (r % 32) {
    case 1: return ((uint64_t)1 << 32) | (next() % 512); /* high bits set over a real number */
    case 2: return ~(uint64_t)0 - (next() % 4);
    case 3: return next() % 1024;
    default: return next() % 460;                   /* Linux's numbers, where the table is */
    }
}

/* The prefix, put together at run time so that the program's own bytes never hold it. */
static char prefix[9];

static int leaked(void) {
    for (size_t i = 0; i + 8 <= SCRATCH_BYTES; i++)
        if (scratch[i] == 'S' && memcmp(scratch + i, prefix, 8) == 0) {
            fwrite(scratch + i, 1, SCRATCH_BYTES - i < 64 ? SCRATCH_BYTES - i : 64, stdout);
            return 1;
        }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    memcpy(prefix, "SFHOST", 6);
    prefix[6] = prefix[7] = ':';
    state = strtoull(argv[1], 0, 0) | 1;
    unsigned long count = strtoul(argv[2], 0, 0);
    unsigned char *pages = mmap(0, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED) return 3;
    munmap(pages + 4096, 4096);
    hole = (uint64_t)(uintptr_t)(pages + 4096);
    brk_end = (uint64_t)(uintptr_t)sbrk(0);
    for (unsigned long i = 0; i < count; i++) {
        uint64_t nr = number();
        /* exit and exit_group end the run; rt_sigreturn, pause and rt_sigsuspend stop it (the
         * table's Stop calls): left out so that a run goes deep. */
        if (nr == 60 || nr == 231 || nr == 15 || nr == 34 || nr == 130) continue;
        /* Fresh scratch contents for every call: random words (a time read by an earlier call
         * would otherwise make the next nanosleep sleep for as long as the clock says), or
         * zeros one call in eight. */
        uint64_t *words = (uint64_t *)scratch;
        int zeros = next() % 8 == 0;
        for (size_t w = 0; w < SCRATCH_BYTES / 8; w++) words[w] = zeros ? 0 : next();
        uint64_t a[6];
        for (int j = 0; j < 6; j++) a[j] = argument();
        long ret = raw_syscall(nr, a);
        if (ret < 0 && ret >= -4095) errno_counts[-ret]++;
        else ok_count++;
        if (leaked()) {
            printf("\nhost data after call %lu: nr %llu\n", i, (unsigned long long)nr);
            fflush(stdout);
            _exit(99);
        }
    }
    printf("ok %u", ok_count);
    for (int e = 0; e < 4096; e++)
        if (errno_counts[e]) printf(" e%d %u", e, errno_counts[e]);
    printf("\n");
    fflush(stdout);
    _exit(0);
}
