# A 64 KiB "BIOS" for QEMU: from the reset vector straight to long mode on the tables
# arch::install wrote (loaded at 0x1000 by run.sh), with the control registers and MSRs KvmCpu
# sets through KVM_SET_SREGS/MSRS/XCRS (consts.s, generated from arch/), then `iretq` to the
# test program at CPL3 -- the state KvmCpu::new starts the guest in.
.include "consts.s"
.set BASE, 0xF0000              # where the last 64 KiB of the ROM also appear
.code16
.org 0
start16:
  cli
  movb $0xFF, %al
  outb %al, $0x21               # mask both PICs: the KVM VM has no interrupt sources either
  outb %al, $0xA1
  movl $CR4, %eax
  movl %eax, %cr4
  movl $CR3, %eax
  movl %eax, %cr3
  movl $0xC0000080, %ecx        # EFER (LMA is set by the CPU when paging turns on)
  movl $EFER_WRITABLE, %eax
  xorl %edx, %edx
  wrmsr
  movl $0xC0000081, %ecx        # STAR
  movl $STAR_LO, %eax
  movl $STAR_HI, %edx
  wrmsr
  movl $0xC0000082, %ecx        # LSTAR
  movl $LSTAR, %eax
  xorl %edx, %edx
  wrmsr
  movl $0xC0000084, %ecx        # SFMASK
  movl $SFMASK, %eax
  xorl %edx, %edx
  wrmsr
  movl $0xC0000100, %ecx        # FS base, as KvmCpu::set_fs_base would set it
  movl $0x7F0000, %eax
  xorl %edx, %edx
  wrmsr
  lgdtl %cs:gdtr
  lidtl %cs:idtr
  movl $CR0, %eax
  movl %eax, %cr0               # PE and PG at once, with EFER.LME: long mode
  ljmpl $0x08, $(BASE + long_entry)
gdtr: .word GDT_LIMIT
      .long GDT_ADDR
idtr: .word IDT_LIMIT
      .long IDT_ADDR
.code64
long_entry:
  movq $0x80000, %rsp
  xorl %ecx, %ecx
  movl $XCR0, %eax
  xorl %edx, %edx
  xsetbv
  # KVM_SET_SREGS loads TR as a busy TSS; ltr wants it available and marks it busy itself.
  movb $0x89, GDT_ADDR + TSS_SELECTOR + 5
  movw $TSS_SELECTOR, %ax
  ltr %ax
  movw $USER_SS, %ax
  movw %ax, %ds
  movw %ax, %es
  movw %ax, %gs
  movw %ax, %fs                 # keeps the FS base MSR (no descriptor base in 64-bit mode)
  movl $0xC0000100, %ecx        # ... but re-set it in case this CPU model zeroes it on load
  movl $0x7F0000, %eax
  xorl %edx, %edx
  wrmsr
  pushq $USER_SS
  pushq $0x800000               # the program's stack pointer
  pushq $USER_RFLAGS
  pushq $USER_CS
  pushq $0x100000               # the program's entry
  iretq
.code16
.org 0xFFF0
  ljmp $0xF000, $start16        # the reset vector
.org 0x10000
