/* Prints a greeting with its arguments and a line read from stdin: built both static and
 * dynamic, so the loader's two paths (no interpreter, ld.so) run the same program. */
#include <stdio.h>

int main(int argc, char **argv) {
    char line[256];
    printf("hello from %s\n", argc > 0 ? argv[0] : "?");
    for (int i = 1; i < argc; i++)
        printf("arg %d: %s\n", i, argv[i]);
    if (fgets(line, sizeof line, stdin))
        printf("stdin: %s", line);
    fflush(stdout);
    fprintf(stderr, "bye\n");
    return argc == 1 ? 0 : 3;
}
