# The CPL3 test program, loaded at 0x100000 (USER_BASE). Each `syscall` goes through the LSTAR
# stub, whose `out` to SYSCALL_PORT (a QEMU debug console here) prints the low byte of rax:
# "ABCDE." means every check passed; a lower-case letter names the check that failed.
# Then it raises the exception chosen by MODE; the exception stub's `out` to EXCEPTION_PORT
# prints "F" and halts with vector/error code/rip/cs in rdi/rsi/rdx/rcx.
.intel_syntax noprefix
.code64
.set CHECK, 0x7ff000            # number of the check in progress (user memory)
.set TLS, 0x7F0000              # the FS base bios.s sets

.macro expect a, b, n
  mov byte ptr [CHECK], \n
  cmp \a, \b
  jne fail
.endm

entry:
  push 0x202
  popfq                         # known flags: syscall must hand them back in r11
  mov rbx, 0x11111111
  mov rbp, 0x22222222
  mov rsi, 0x33333333
  mov rdi, 0x44444444
  mov rdx, 0x55555555
  mov r8,  0x66666666
  mov r9,  0x77777777
  mov r10, 0x78787878
  mov r12, 0x12121212
  mov r13, 0x13131313
  mov r14, 0x14141414
  mov r15, 0x15151515
  mov qword ptr [rsp-8], 0x5a5a     # the red zone must survive a syscall
  mov qword ptr [rsp-128], 0x6b6b
  mov rax, 0x41                 # 'A'
  syscall
after_a:
  expect rax, 0x41, 1           # no VMM answers here, so rax comes back as it went in
  lea rax, [rip+after_a]
  expect rcx, rax, 2            # rcx = return address, as after sysret
  expect r11, 0x202, 3          # r11 = rflags
  expect rsp, 0x800000, 4
  expect "qword ptr [rsp-8]", 0x5a5a, 5
  expect "qword ptr [rsp-128]", 0x6b6b, 6
  expect rbx, 0x11111111, 7
  expect rbp, 0x22222222, 8
  expect rsi, 0x33333333, 9
  expect rdi, 0x44444444, 10
  expect rdx, 0x55555555, 11
  expect r8, 0x66666666, 12
  expect r9, 0x77777777, 13
  expect r10, 0x78787878, 14
  expect r12, 0x12121212, 15
  expect r13, 0x13131313, 16
  expect r14, 0x14141414, 17
  expect r15, 0x15151515, 18

  mov rsp, 0xdead0000           # 'B': an unmapped stack pointer (the stub must not use it)
  mov rax, 0x42
  syscall
  mov r12, 0xdead0000
  expect rsp, r12, 19
  mov rsp, 0x800000

  push 0x4202                   # 'C': NT set; SFMASK clears it, or iretq would #GP
  popfq
  mov rax, 0x43
  syscall
  pushfq
  pop rax
  and rax, 0x4000
  expect rax, 0x4000, 20        # ... and the program gets its own NT back
  push 0x202
  popfq

  std                           # 'D': DF survives the round trip
  mov rax, 0x44
  syscall
  pushfq
  pop rax
  cld
  and rax, 0x400
  expect rax, 0x400, 21

  mov qword ptr [TLS], 0x1234   # 'E': FS base, XCR0 and AVX, FSGSBASE at CPL3
  mov rax, 0x45
  syscall
  mov rax, fs:[0]
  expect rax, 0x1234, 22
  xor ecx, ecx
  xgetbv
  expect eax, 7, 23
  vpxor ymm0, ymm0, ymm0        # #UD unless CR4.OSXSAVE and XCR0.AVX
  rdfsbase rax                  # #UD unless CR4.FSGSBASE
  expect rax, TLS, 24

  mov rax, 0x2E                 # '.'
  syscall
  mov al, 0x46                  # 'F', printed by the exception stub
.if MODE == 0
  mov rbx, [0x5000]             # read the system area: #PF, error 5 (present, user)
.elseif MODE == 1
  mov rbx, [0]                  # NULL: #PF, error 4 (not present, user)
.elseif MODE == 2
  out 0xE0, al                  # `out` at CPL3: #GP(0), nothing reaches the console
.elseif MODE == 3
  int3                          # #BP through its DPL 3 gate
.elseif MODE == 4
  int 0x80                      # beyond the IDT limit: #GP
.elseif MODE == 5
  ud2                           # #UD
.elseif MODE == 6
  xor ecx, ecx
  div ecx                       # #DE (no CPU error code: the stub pushes 0)
.elseif MODE == 7
  mov [0x8ff0], rax             # write the syscall frame: #PF, error 7 (present, write, user)
.elseif MODE == 8
  jmp qword ptr [rip+stub_address]  # execute the system area: #PF, error 0x15 (fetch)
.elseif MODE == 9
  mov rbx, [0x1000000]          # above guest memory: #PF, error 4
.endif
  hlt
stub_address: .quad 0x7000
fail:
  movzx eax, byte ptr [CHECK]
  add eax, 0x60                 # 'a' + check number
  syscall
  hlt
