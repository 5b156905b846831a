/* Hardware faults and the signal handlers they run: what each handler sees (signal, si_code,
 * si_addr, trap number, error code) and how the program goes on (a jump out, a return to the
 * faulting instruction after the handler changed its operand, a return past it with a register
 * set, a handler on the alternate stack after a stack overflow), and a fault that no handler
 * may take ending the process with its signal. Prints only facts that are the same natively
 * and in the VM (no addresses). */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

static sigjmp_buf escape;
static volatile sig_atomic_t seen_signal, seen_code;
static volatile long seen_trapno, seen_err;
static void *volatile seen_addr;
static volatile int skip_bytes;
static long retried_value = 5678;

static void record(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    seen_signal = sig;
    seen_code = info->si_code;
    seen_addr = info->si_addr;
    seen_trapno = uc->uc_mcontext.gregs[REG_TRAPNO];
    seen_err = uc->uc_mcontext.gregs[REG_ERR];
}

/* Records what it was given, then leaves by a jump. */
static void jump_out(int sig, siginfo_t *info, void *context) {
    record(sig, info, context);
    siglongjmp(escape, 1);
}

/* Records, then returns past `skip_bytes` of the faulting instruction. */
static void go_on(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    record(sig, info, context);
    uc->uc_mcontext.gregs[REG_RIP] += skip_bytes;
}

/* Records, then returns to the faulting `mov (%rax), %rbx` with rax pointing at a value: the
 * load runs again and succeeds. */
static void retry_load(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    record(sig, info, context);
    uc->uc_mcontext.gregs[REG_RAX] = (long)&retried_value;
}

/* Returns to the instruction after the 3-byte `mov (%rax), %rbx`, with rbx set as if the load
 * had read 1234. */
static void emulate_load(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    record(sig, info, context);
    uc->uc_mcontext.gregs[REG_RIP] += 3;
    uc->uc_mcontext.gregs[REG_RBX] = 1234;
}

/* rbx = *address through the 3-byte `mov (%rax), %rbx` the handlers above know. */
static __attribute__((noinline)) long load(long *address) {
    long loaded;
    __asm__ volatile("xor %%ebx, %%ebx\n\tmov (%%rax), %%rbx\n\tmov %%rbx, %0"
                     : "=r"(loaded)
                     : "a"(address)
                     : "rbx", "memory");
    return loaded;
}

static void handle(int sig, void (*handler)(int, siginfo_t *, void *), int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | flags;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) != 0) {
        perror("sigaction");
        exit(1);
    }
}

static void report(const char *what, void *expected_addr) {
    printf("%s: signal %d code %d trapno %ld err %ld addr %s\n", what, (int)seen_signal,
           (int)seen_code, seen_trapno, seen_err,
           seen_addr == expected_addr ? "as expected" : "other");
    seen_signal = 0;
}

static int recurse(int depth) {
    volatile char pad[1024];
    pad[0] = (char)depth;
    return recurse(depth + 1) + pad[0];
}

static void *overflow(void *arg) {
    (void)arg;
    stack_t ss = {.ss_sp = malloc(1 << 16), .ss_size = 1 << 16};
    sigaltstack(&ss, NULL);
    if (sigsetjmp(escape, 1) == 0)
        recurse(0);
    return (void *)(intptr_t)seen_signal;
}

/* A child that faults with SIGSEGV blocked, ignored, or with a one-shot handler that returns
 * to the same fault: each ends by the signal. */
static void fatal(const char *what, int how) {
    pid_t pid = fork();
    if (pid == 0) {
        if (how == 0) {
            sigset_t set;
            sigemptyset(&set);
            sigaddset(&set, SIGSEGV);
            sigprocmask(SIG_BLOCK, &set, NULL);
        } else if (how == 1) {
            signal(SIGSEGV, SIG_IGN);
        } else {
            handle(SIGSEGV, record, SA_RESETHAND);
        }
        *(volatile int *)0 = 1;
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    printf("%s: %s %d\n", what, WIFSIGNALED(status) ? "killed by" : "exited",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    handle(SIGSEGV, jump_out, 0);
    if (sigsetjmp(escape, 1) == 0)
        *(volatile int *)0;
    report("null read", NULL);
    if (sigsetjmp(escape, 1) == 0)
        *(volatile int *)16 = 1;
    report("null write", (void *)16);

    /* Below every mapping of a static program (where the VMM keeps its own tables). */
    if (sigsetjmp(escape, 1) == 0)
        (void)*(volatile long *)0x5000;
    report("low read", (void *)0x5000);

    /* The handler moves rip past the load and sets its destination register. */
    handle(SIGSEGV, emulate_load, 0);
    long loaded = load((long *)0);
    report("load emulated by the handler", NULL);
    printf("the handler's rbx: %ld\n", loaded);

    /* The handler points rax at a value and returns to the load, which runs again. */
    handle(SIGSEGV, retry_load, 0);
    loaded = load((long *)8);
    report("load retried by the handler", (void *)8);
    printf("the retried load read: %ld\n", loaded);

    /* The same far above the program's memory, where nothing is mapped either (in the VM:
     * memory it was never handed, whose access the VMM sees as an emulated one). */
    loaded = load((long *)0x8000000);
    report("wild load retried by the handler", (void *)0x8000000);
    printf("the retried load read: %ld\n", loaded);

    handle(SIGFPE, go_on, 0);
    skip_bytes = 3;
    long quotient = 7;
    __asm__ volatile("mov %0, %%rax\n\tcqo\n\txor %%ecx, %%ecx\n\tidiv %%rcx\n\tmov %%rax, %0"
                     : "+r"(quotient)
                     :
                     : "rax", "rcx", "rdx");
    report("divide by zero", NULL);
    printf("after the divide: %ld\n", quotient);

    handle(SIGILL, go_on, 0);
    skip_bytes = 2;
    __asm__ volatile("ud2");
    report("ud2", NULL);

    handle(SIGTRAP, go_on, 0);
    skip_bytes = 0;
    __asm__ volatile("int3");
    report("int3", NULL);

    handle(SIGSEGV, jump_out, SA_ONSTACK);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 18);
    pthread_t thread;
    void *result;
    pthread_create(&thread, &attr, overflow, NULL);
    pthread_join(thread, &result);
    printf("stack overflow on the alternate stack: signal %d\n", (int)(intptr_t)result);

    fatal("blocked", 0);
    fatal("ignored", 1);
    fatal("returned to the fault", 2);
    return 0;
}
