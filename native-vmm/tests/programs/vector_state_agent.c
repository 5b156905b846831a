/* A template "agent" that keeps vector and FPU state live across its ready point: it loads
 * ymm0-15 with distinct bytes (and, where AVX-512 is enabled, all of zmm15 and zmm16 and the
 * mask register k1), sets MXCSR and the x87 control word to non-default values,
 * makes the AWAIT_REQUEST hand-off (where a template build snapshots it), then, in the fork
 * that serves a request, stores them again and prints which differ. Prints "vector state
 * intact" when all survived. Registers are loaded and stored in one asm block around the
 * system call, so the compiler cannot use them in between. */
#include <cpuid.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define AWAIT_REQUEST 0x53460001L
#define MXCSR_VALUE 0x7F80u    /* all exceptions masked, flush-to-zero, round toward zero */
#define X87_CONTROL_VALUE 0x0C7Fu  /* all exceptions masked, round toward zero */

static uint8_t loaded[16][32] __attribute__((aligned(32)));
static uint8_t stored[16][32] __attribute__((aligned(32)));
/* zmm15, zmm16 (64 bytes each), then k1 (8 bytes). */
static uint8_t loaded512[136] __attribute__((aligned(64)));
static uint8_t stored512[136] __attribute__((aligned(64)));
static char message[1 << 16];

#define LOAD(n) "vmovdqa " #n "*32(%[in]), %%ymm" #n "\n\t"
#define STORE(n) "vmovdqa %%ymm" #n ", " #n "*32(%[out])\n\t"

/* AVX-512F usable: CPUID.(7,0):EBX bit 16, and the OS (here: the VM) enabled opmask and ZMM
 * state in XCR0. */
static int avx512_enabled(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 16))) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xE6) == 0xE6;
}

int main(void) {
    for (int r = 0; r < 16; r++)
        for (int i = 0; i < 32; i++)
            loaded[r][i] = (uint8_t)(r * 37 + i * 11 + 1);
    for (int i = 0; i < 136; i++)
        loaded512[i] = (uint8_t)(i * 7 + 3);
    int avx512 = avx512_enabled();
    uint32_t mxcsr_in = MXCSR_VALUE, mxcsr_out = 0;
    uint16_t fcw_in = X87_CONTROL_VALUE, fcw_out = 0;
    long ret;
    if (avx512) /* zmm15's low half is ymm15: the same bytes either way */
        memcpy(loaded[15], loaded512, 32);
    __asm__ volatile(
        "ldmxcsr %[mxcsr_in]\n\t"
        "fldcw %[fcw_in]\n\t"
        LOAD(0) LOAD(1) LOAD(2) LOAD(3) LOAD(4) LOAD(5) LOAD(6) LOAD(7)
        LOAD(8) LOAD(9) LOAD(10) LOAD(11) LOAD(12) LOAD(13) LOAD(14) LOAD(15)
        "test %[avx512], %[avx512]\n\t"
        "jz 1f\n\t"
        "vmovdqu64 (%[in512]), %%zmm15\n\t"
        "vmovdqu64 64(%[in512]), %%zmm16\n\t"
        "kmovq 128(%[in512]), %%k1\n"
        "1:\n\t"
        "syscall\n\t"
        STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5) STORE(6) STORE(7)
        STORE(8) STORE(9) STORE(10) STORE(11) STORE(12) STORE(13) STORE(14) STORE(15)
        "test %[avx512], %[avx512]\n\t"
        "jz 2f\n\t"
        "vmovdqu64 %%zmm15, (%[out512])\n\t"
        "vmovdqu64 %%zmm16, 64(%[out512])\n\t"
        "kmovq %%k1, 128(%[out512])\n"
        "2:\n\t"
        "stmxcsr %[mxcsr_out]\n\t"
        "fnstcw %[fcw_out]\n\t"
        : "=a"(ret), [mxcsr_out] "=m"(mxcsr_out), [fcw_out] "=m"(fcw_out)
        : "a"(AWAIT_REQUEST), "D"(message), "S"(sizeof message), [in] "r"(loaded), [out] "r"(stored),
          [in512] "r"(loaded512), [out512] "r"(stored512), [avx512] "r"(avx512),
          [mxcsr_in] "m"(mxcsr_in), [fcw_in] "m"(fcw_in)
        : "rcx", "r11", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
          "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
    /* zmm16 and k1 are not declared clobbered: without -mavx512f the compiler never uses them
     * (nor may it be told about them). */
    if (ret < 0) {
        printf("AWAIT_REQUEST failed: %ld\n", ret);
        return 2;
    }
    int bad = 0;
    for (int r = 0; r < 16; r++) {
        if (memcmp(loaded[r], stored[r], 16) != 0) { printf("xmm%d lost\n", r); bad = 1; }
        if (memcmp(loaded[r] + 16, stored[r] + 16, 16) != 0) { printf("upper half of ymm%d lost\n", r); bad = 1; }
    }
    if (avx512) {
        if (memcmp(loaded512 + 32, stored512 + 32, 32) != 0) { printf("upper half of zmm15 lost\n"); bad = 1; }
        if (memcmp(loaded512 + 64, stored512 + 64, 64) != 0) { printf("zmm16 lost\n"); bad = 1; }
        if (memcmp(loaded512 + 128, stored512 + 128, 8) != 0) { printf("k1 lost\n"); bad = 1; }
    }
    if (mxcsr_out != MXCSR_VALUE) { printf("mxcsr %#x, expected %#x\n", mxcsr_out, MXCSR_VALUE); bad = 1; }
    if (fcw_out != X87_CONTROL_VALUE) { printf("x87 control word %#x, expected %#x\n", fcw_out, X87_CONTROL_VALUE); bad = 1; }
    if (!bad) printf("vector state intact%s\n", avx512 ? " (with AVX-512)" : "");
    return bad;
}
