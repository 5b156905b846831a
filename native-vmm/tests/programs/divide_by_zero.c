/* Integer division by zero: the run must end as a crash with the divide-error vector. */
int main(void) {
    volatile int numerator = 1, denominator = 0;
    return numerator / denominator;
}
