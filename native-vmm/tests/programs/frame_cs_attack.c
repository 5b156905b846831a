/* The syscall entry's iretq frame lives in a user-writable page (the PVM backend runs the
 * entry at CPL3). This program writes a kernel CS (0x08) and SS (0x10) into the frame's slots,
 * makes a system call and reports the privilege level it came back at: on VT-x/SVM, where the
 * entry runs at CPL0, a stub that trusted the frame would return to this code at CPL0. */
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>

#define FRAME_CS ((volatile uint64_t *)0x8fe0)
#define FRAME_SS ((volatile uint64_t *)0x8ff8)

int main(void) {
    *FRAME_CS = 0x08;
    *FRAME_SS = 0x10;
    long pid = syscall(SYS_getpid);
    uint16_t cs, ss;
    __asm__ volatile("mov %%cs, %0\n\tmov %%ss, %1" : "=r"(cs), "=r"(ss));
    printf("pid %ld cs %#x ss %#x cpl %d\n", pid, cs, ss, cs & 3);
    return 0;
}
