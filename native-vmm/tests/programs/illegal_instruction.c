/* Executes ud2: the run must end as a crash with the invalid-opcode vector. */
int main(void) {
    __builtin_trap();
}
