//! Hand-assembled guests run on the development CPU.

use std::time::{Duration, Instant};

use super::*;
use crate::layout::USER_BASE;

const MEM_SIZE: u64 = 4 << 20;
const STACK_TOP: u64 = MEM_SIZE - 0x1000;

fn guest(code: &[u8]) -> (GuestMemory, PtraceCpu) {
    let mem = GuestMemory::new(MEM_SIZE).unwrap();
    mem.write(USER_BASE, code).unwrap();
    let cpu = PtraceCpu::new(&mem, USER_BASE, STACK_TOP).unwrap();
    (mem, cpu)
}

fn far_deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[test]
fn syscalls_stop_with_their_number_and_arguments_and_take_our_return_value() {
    let mut code = vec![
        0xb8, 0x01, 0x00, 0x00, 0x00, // mov eax, 1 (write)
        0xbf, 0x01, 0x00, 0x00, 0x00, // mov edi, 1
        0x48, 0x8d, 0x35, 0x10, 0x00, 0x00, 0x00, // lea rsi, [rip+16] (msg)
        0xba, 0x03, 0x00, 0x00, 0x00, // mov edx, 3
        0x0f, 0x05, // syscall
        0x89, 0xc7, // mov edi, eax (the value we return)
        0xb8, 0xe7, 0x00, 0x00, 0x00, // mov eax, 231 (exit_group)
        0x0f, 0x05, // syscall
    ];
    let msg_at = USER_BASE + code.len() as u64;
    code.extend_from_slice(b"hi\n");
    let (mem, mut cpu) = guest(&code);

    let exit = cpu.run(far_deadline()).unwrap();
    assert_eq!(
        exit,
        CpuExit::Syscall {
            nr: 1,
            args: [1, msg_at, 3, 0, 0, 0]
        }
    );
    assert_eq!(mem.read_vec(msg_at, 3).unwrap(), b"hi\n");
    cpu.set_syscall_return(3).unwrap();

    let exit = cpu.run(far_deadline()).unwrap();
    assert_eq!(
        exit,
        CpuExit::Syscall {
            nr: 231,
            args: [3, msg_at, 3, 0, 0, 0]
        }
    );
}

#[test]
fn fs_base_set_from_the_host_is_what_the_guest_reads_through_fs() {
    let tls = USER_BASE + 0x800;
    let code = [
        0x0f, 0x05, // syscall (stands for arch_prctl)
        0x64, 0x48, 0x8b, 0x3c, 0x25, 0x00, 0x00, 0x00, 0x00, // mov rdi, fs:[0]
        0xb8, 0x3c, 0x00, 0x00, 0x00, // mov eax, 60 (exit)
        0x0f, 0x05, // syscall
    ];
    let (mem, mut cpu) = guest(&code);
    mem.write_u64(tls, 0x1234_5678_9abc).unwrap();
    assert!(matches!(
        cpu.run(far_deadline()).unwrap(),
        CpuExit::Syscall { .. }
    ));
    cpu.set_fs_base(tls).unwrap();
    cpu.set_syscall_return(0).unwrap();
    assert_eq!(
        cpu.run(far_deadline()).unwrap(),
        CpuExit::Syscall {
            nr: 60,
            args: [0x1234_5678_9abc, 0, 0, 0, 0, 0]
        }
    );
}

#[test]
fn guest_writes_are_seen_in_guest_memory() {
    let code = [
        0xc7, 0x04, 0x24, 0xef, 0xbe, 0xad, 0xde, // mov dword [rsp], 0xdeadbeef
        0x0f, 0x05, // syscall
    ];
    let (mem, mut cpu) = guest(&code);
    assert!(matches!(
        cpu.run(far_deadline()).unwrap(),
        CpuExit::Syscall { .. }
    ));
    assert_eq!(mem.read_u32(STACK_TOP).unwrap(), 0xdead_beef);
}

fn expect_fault(code: &[u8]) -> GuestFault {
    let (_mem, mut cpu) = guest(code);
    match cpu.run(far_deadline()).unwrap() {
        CpuExit::Fault(fault) => fault,
        other => panic!("expected a fault, got {other:?}"),
    }
}

#[test]
fn ud2_is_an_invalid_opcode_at_its_rip() {
    let fault = expect_fault(&[0x90, 0x0f, 0x0b]); // nop; ud2
    assert_eq!(
        (fault.vector, fault.rip, fault.address),
        (6, USER_BASE + 1, None)
    );
}

#[test]
fn null_page_write_is_a_page_fault_with_its_address() {
    let fault = expect_fault(&[0xc6, 0x04, 0x25, 0x08, 0x00, 0x00, 0x00, 0x01]); // mov byte [0x8], 1
    assert_eq!(
        (fault.vector, fault.rip, fault.address),
        (14, USER_BASE, Some(8))
    );
}

#[test]
fn system_area_is_invisible_to_the_guest() {
    let fault = expect_fault(&[0x48, 0x8b, 0x04, 0x25, 0x00, 0x20, 0x00, 0x00]); // mov rax, [0x2000]
    assert_eq!((fault.vector, fault.address), (14, Some(0x2000)));
}

#[test]
fn division_by_zero_is_a_divide_error() {
    let fault = expect_fault(&[0x31, 0xc9, 0xf7, 0xf1]); // xor ecx, ecx; div ecx
    assert_eq!((fault.vector, fault.rip), (0, USER_BASE + 2));
}

#[test]
fn privileged_instruction_is_a_general_protection_fault() {
    let fault = expect_fault(&[0xf4]); // hlt
    assert_eq!(
        (fault.vector, fault.rip, fault.address),
        (13, USER_BASE, None)
    );
}

#[test]
fn int_0x80_is_a_general_protection_fault_not_a_system_call() {
    // Hosts without IA-32 emulation raise the #GP themselves (error code unknown to ptrace);
    // others run an i386 system call, which the development CPU turns into the same #GP.
    let fault = expect_fault(&[0xb8, 0x01, 0x00, 0x00, 0x00, 0xcd, 0x80]); // mov eax, 1; int 0x80
    assert_eq!((fault.vector, fault.rip), (13, USER_BASE + 5));
}

#[test]
fn endless_loop_reaches_the_deadline() {
    let (_mem, mut cpu) = guest(&[0xeb, 0xfe]); // jmp $
    let start = Instant::now();
    assert_eq!(
        cpu.run(start + Duration::from_millis(100)).unwrap(),
        CpuExit::DeadlineReached
    );
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(2),
        "took {took:?}"
    );
}

#[test]
fn a_late_watchdog_stop_does_not_end_a_later_run() {
    // Deadline passes while the host is "handling" the syscall; the next run has a new deadline.
    let code = [
        0x0f, 0x05, // syscall
        0x0f, 0x05, // syscall
    ];
    let (_mem, mut cpu) = guest(&code);
    assert!(matches!(
        cpu.run(Instant::now() + Duration::from_millis(20)).unwrap(),
        CpuExit::Syscall { .. }
    ));
    std::thread::sleep(Duration::from_millis(60));
    assert!(matches!(
        cpu.run(far_deadline()).unwrap(),
        CpuExit::Syscall { .. }
    ));
}

#[test]
fn guest_range_taken_by_the_host_is_refused() {
    // The test binary itself lies somewhere high; a guest that large cannot be mapped.
    let err = ensure_range_free(USER_BASE, u64::MAX >> 1).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
}

#[test]
fn child_startup_failures_are_explained() {
    assert!(
        ptrace_sys::describe_child_exit(128 + 1).ends_with("Operation not permitted (os error 1)")
    );
    assert!(ptrace_sys::describe_child_exit(120).contains("PTRACE_TRACEME"));
    assert!(ptrace_sys::describe_child_exit(3).contains("code 3"));
}
