/* Writes through a NULL pointer: the run must end as a crash with address 0. */
int main(void) {
    volatile int *p = (volatile int *)0;
    *p = 42;
    return 0;
}
