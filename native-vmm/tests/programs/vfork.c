/* vfork and posix_spawn: the child runs on the parent's memory while the parent waits for it to
 * exec or exit. What the child writes (a global, errno after a failed exec, memory it maps) the
 * parent reads afterwards; posix_spawn reports a failed exec as its error. Run with the argument
 * "exec-child", it is the program a vfork child execs. Prints the same in a VM as natively. */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static volatile int written_by_child = 1;
static char *volatile mapped_by_child;
static volatile int exec_errno;

static int wait_status(pid_t pid) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc > 1 && strcmp(argv[1], "exec-child") == 0) {
        printf("the exec'd child runs\n");
        return 9;
    }

    pid_t pid = vfork();
    if (pid == 0) {
        written_by_child = 42;
        _exit(5);
    }
    int status = wait_status(pid);
    printf("a global the child wrote: %d, its status %d\n", written_by_child, status);

    pid = vfork();
    if (pid == 0) {
        char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page != MAP_FAILED)
            strcpy(page, "memory the child mapped");
        mapped_by_child = page;
        _exit(0);
    }
    wait_status(pid);
    if (mapped_by_child != MAP_FAILED && mapped_by_child != NULL) {
        printf("the parent reads: %s\n", mapped_by_child);
        printf("and unmaps it: %d\n", munmap(mapped_by_child, 4096));
    }

    pid = vfork();
    if (pid == 0) {
        execl("/nonexistent", "nonexistent", (char *)NULL);
        exec_errno = errno;
        _exit(127);
    }
    status = wait_status(pid);
    printf("a failed exec: errno %d, status %d\n", exec_errno, status);

    pid = vfork();
    if (pid == 0) {
        execl(argv[0], argv[0], "exec-child", (char *)NULL);
        _exit(126);
    }
    printf("the exec'd child's status: %d\n", wait_status(pid));

    char *spawn_argv[] = {"nonexistent", NULL};
    int error = posix_spawn(&pid, "/nonexistent", NULL, NULL, spawn_argv, environ);
    printf("posix_spawn of a missing program: %s\n", strerror(error));
    char *self_argv[] = {argv[0], "exec-child", NULL};
    error = posix_spawn(&pid, argv[0], NULL, NULL, self_argv, environ);
    printf("posix_spawn of itself: %s, status %d\n", strerror(error), wait_status(pid));
    return 0;
}
