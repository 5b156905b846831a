//! The vCPU state a guest program owns, on the KVM vCPU: what survives a template snapshot and
//! what a program cannot forge. Runs on KVM only (there is no other product CPU).

mod common;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::{compile, describe, request, scaled, Linking};
use sandfork_vmm::agent::{AgentCommand, AgentRequest};
use sandfork_vmm::fs::Image;
use sandfork_vmm::snapshot::{self, ForkMemory, Template};
use sandfork_vmm::status::RunStatus;
use sandfork_vmm::vm::{self, RunLimits};

const VECTOR_AGENT: AgentCommand = AgentCommand {
    cwd: sandfork_vmm::fs::WORK_DIR,
    program: "/bin/vector_state_agent-static",
    argv: &["vector_state_agent"],
};

/// The C programs, compiled once per test process, and the image holding them at
/// /bin/<name>-static.
fn programs() -> &'static (PathBuf, Arc<Image>) {
    static PROGRAMS: OnceLock<(PathBuf, Arc<Image>)> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let out = common::process_dir("cpu-state-programs");
        let paths: Vec<String> = ["vector_state_agent", "frame_cs_attack", "fault_handlers"]
            .iter()
            .map(|name| {
                let binary = compile(name, Linking::Static, &out);
                format!(
                    r#"{{"host": "{}", "guest": "/bin/{name}-static"}}"#,
                    binary.display()
                )
            })
            .collect();
        let image = common::build_image(
            "cpu-state-image",
            &format!(
                r#"{{"name": "cpu-state", "paths": [{}], "writable_dirs": ["/tmp", "/work"]}}"#,
                paths.join(", ")
            ),
        );
        (out, image)
    })
}

fn programs_image() -> Arc<Image> {
    programs().1.clone()
}

#[test]
fn vector_and_fpu_registers_survive_the_snapshot_into_a_fork() {
    let dir = common::process_dir("cpu-state-template");
    let limits = RunLimits {
        timeout: scaled(Duration::from_secs(10)),
        boot_timeout: scaled(vm::AGENT_BOOT_TIMEOUT),
        ..RunLimits::default()
    };
    snapshot::build(
        programs_image(),
        "vector-state",
        &VECTOR_AGENT,
        &limits,
        &sandfork_vmm::kvm::new_cpu,
        &dir,
    )
    .unwrap_or_else(|e| panic!("building the template: {e}"));
    let template = Template::load(&dir, programs_image(), &VECTOR_AGENT)
        .unwrap_or_else(|e| panic!("loading the template: {e}"));
    for _ in 0..2 {
        let restored = snapshot::serve_restored(
            &template,
            ForkMemory::CopyOnWrite,
            &sandfork_vmm::kvm::restore_cpu,
            AgentRequest::new(""),
            &limits,
        )
        .unwrap_or_else(|e| panic!("serving a fork: {e}"));
        let outcome = restored.outcome;
        let stdout = String::from_utf8_lossy(&outcome.stdout);
        assert!(
            stdout == "vector state intact\n" || stdout == "vector state intact (with AVX-512)\n",
            "{}",
            describe(&outcome)
        );
        assert_eq!(
            outcome.status,
            RunStatus::Exited { code: 0 },
            "{}",
            describe(&outcome)
        );
    }
}

/// Runs /bin/`name`-static on the KVM vCPU; it must exit 0.
fn run_program(name: &str) -> vm::RunOutcome {
    let outcome = vm::launch(
        programs_image(),
        &request(&format!("/bin/{name}-static"), &[]),
        &sandfork_vmm::kvm::new_cpu,
    )
    .unwrap_or_else(|e| panic!("launching {name}: {e}"));
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{name}: {}",
        describe(&outcome)
    );
    outcome
}

#[test]
fn a_kernel_cs_written_into_the_syscall_frame_does_not_return_at_cpl0() {
    let outcome = run_program("frame_cs_attack");
    // The selectors themselves differ by backend (PVM shows its own); the privilege must not.
    let stdout = String::from_utf8_lossy(&outcome.stdout);
    assert!(
        stdout.starts_with("pid 1 cs ") && stdout.ends_with(" cpl 3\n"),
        "{}",
        describe(&outcome)
    );
}

/// A hardware fault runs the program's handler for its signal as on Linux: the handler sees
/// the signal, si_code, si_addr, trap number and error code Linux gives, and the program goes on
/// from where the handler leaves it (a jump out; a return to the faulting instruction, which
/// runs again with the operand the handler changed in its ucontext; a return past it with a
/// register set; the alternate stack after a stack overflow); a fault the thread blocks or
/// ignores, or that its handler returns to unchanged, ends the process with the signal.
/// Compared line for line with the same static program run natively.
#[test]
fn hardware_faults_run_the_programs_signal_handlers_as_on_linux() {
    let outcome = run_program("fault_handlers");
    common::assert_prints_as_natively(&outcome, &programs().0.join("fault_handlers-static"));
}

/// Python's faulthandler prints the traceback of a segmentation fault, a floating-point
/// exception and a stack overflow (its handler on the alternate stack), then raises the signal
/// again with its default action, which ends the process, as natively.
#[test]
fn faulthandler_prints_the_traceback_of_a_fault() {
    for (call, message, signal) in [
        ("faulthandler._read_null()", "Segmentation fault", 11),
        ("faulthandler._sigfpe()", "Floating point exception", 8),
        ("faulthandler._stack_overflow()", "Segmentation fault", 11),
    ] {
        let code =
            format!("import faulthandler\nfaulthandler.enable()\ndef f():\n    {call}\nf()\n");
        let outcome = common::python(&code);
        let stderr = String::from_utf8_lossy(&outcome.stderr);
        assert_eq!(
            outcome.status.exit_code(),
            128 + signal,
            "{call}: {}",
            describe(&outcome)
        );
        assert!(
            stderr.contains(&format!("Fatal Python error: {message}"))
                && stderr.contains("line 4 in f")
                && stderr.contains("line 5 in <module>"),
            "{call}: {}",
            describe(&outcome)
        );
    }
}

/// Guest memory the program was never handed is in no KVM memory slot: touching it crashes the
/// program. A plain load KVM can emulate is a page fault (vector 14), as on Linux; a vector
/// copy it cannot emulate is one too on PVM, while VT-x/SVM KVM injects an invalid opcode
/// (vector 6) into a CPL3 guest whose instruction it failed to emulate.
#[test]
fn memory_never_handed_out_faults() {
    let cases = [
        (
            "import ctypes\nctypes.c_uint64.from_address(0x8000000).value",
            "a load",
            &[14][..],
        ),
        (
            "import ctypes\nctypes.string_at(0x8000000, 4096)",
            "a copy",
            &[14, 6][..],
        ),
    ];
    for (code, kind, vectors) in cases {
        let outcome = common::python(code);
        match &outcome.status {
            RunStatus::Crashed { fault } => assert!(
                vectors.contains(&fault.vector),
                "{kind}: {}",
                describe(&outcome)
            ),
            _ => panic!(
                "{kind} of memory never handed out must crash the program: {}",
                describe(&outcome)
            ),
        }
    }
}

/// Memory handed to the program gets its KVM memory slot when the guest first touches it (an
/// idle VM holds no bookkeeping for it): each kind of first touch must behave as on memory that
/// was always there. A plain store and a plain load are completed by the VMM on guest memory
/// (the load must see bytes the VMM itself wrote there, a read() into the fresh mapping); a
/// vector store KVM cannot emulate runs again once the slot exists.
#[test]
fn handed_out_memory_is_reached_on_first_touch_by_any_access() {
    let code = r#"
import ctypes, mmap, os
def fresh():
    m = mmap.mmap(-1, 6 << 20)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))
m1, a1 = fresh()
ctypes.c_uint64.from_address(a1 + 4096).value = 0x1122334455667788
print(hex(ctypes.c_uint64.from_address(a1 + 4096).value))
m2, a2 = fresh()
os.makedirs('/work/t', exist_ok=True)
with open('/work/t/bytes', 'wb') as f:
    f.write(bytes(range(1, 17)))
fd = os.open('/work/t/bytes', os.O_RDONLY)
print(os.readv(fd, [memoryview(m2)[8192:8192 + 16]]))
print(hex(ctypes.c_uint64.from_address(a2 + 8192 + 8).value))
m3, a3 = fresh()
ctypes.memset(a3 + 12288, 0x5a, 1 << 20)
print(m3[12288:12292], m3[12288 + (1 << 20) - 1:12288 + (1 << 20) + 1])
"#;
    common::assert_prints(
        code,
        "0x1122334455667788\n16\n0x100f0e0d0c0b0a09\nb'ZZZZ' b'Z\\x00'\n",
    );
}

/// Random register values, through every way a state reaches a KVM vCPU outside a fresh load
/// (`load_thread`: thread switches, signal handlers, rt_sigreturn; `reset`: pooled VMs and
/// checkpoints): a state no CPL3 program could hold is refused before KVM sees it, and what
/// KVM then holds is the state with only the rflags a program controls.
#[test]
fn random_register_states_reach_the_vcpu_only_as_user_states() {
    use sandfork_vmm::cpu::{user_rflags, CpuSnapshot, UserRegs, XSAVE_MIN_BYTES};
    use sandfork_vmm::fuzz;
    use sandfork_vmm::layout::USER_BASE;

    const EDGES: [u64; 9] = [
        0,
        USER_BASE,
        (1 << 47) - 8,
        1 << 47,
        0xffff_8000_0000_0000,
        0xffff_8880_0000_0000,
        0x8000_0000_0000_0000,
        u64::MAX,
        0x7fff_f000,
    ];
    let (mut rng, cases) = fuzz::start("random_register_states_reach_the_vcpu_only_as_user_states");
    let value = |rng: &mut fuzz::Rng| match rng.below(3) {
        0 => EDGES[rng.below(EDGES.len())],
        1 => rng.next_u64(),
        _ => USER_BASE + (rng.next_u64() % (1 << 30)),
    };
    let mem = sandfork_vmm::memory::GuestMemory::new(64 << 20).unwrap();
    let start = CpuSnapshot {
        regs: UserRegs {
            rsp: 0x3ff_f000,
            ..UserRegs::default()
        },
        rip: USER_BASE + 0x1000,
        rflags: 0x202,
        fs_base: 0,
        gs_base: 0,
        xsave: vec![0; XSAVE_MIN_BYTES],
    };
    let mut cpu = sandfork_vmm::kvm::restore_cpu(&mem, &start).unwrap();
    let (mut loaded, mut refused) = (0, 0);
    for case in 0..cases {
        let state = CpuSnapshot {
            regs: UserRegs {
                rax: rng.next_u64(),
                rsp: value(&mut rng),
                r11: rng.next_u64(),
                ..UserRegs::default()
            },
            rip: value(&mut rng),
            rflags: rng.next_u64(),
            fs_base: value(&mut rng),
            gs_base: value(&mut rng),
            xsave: vec![0; XSAVE_MIN_BYTES],
        };
        let valid = state.check_user().is_ok();
        let result = if case % 2 == 0 {
            cpu.load_thread(&state)
        } else {
            cpu.reset(&state)
        };
        match result {
            Err(e) if !valid && e.kind() == std::io::ErrorKind::InvalidInput => {
                refused += 1;
                continue;
            }
            Err(e) => panic!("case {case}: {state:x?}: {e}"),
            Ok(()) => assert!(valid, "case {case}: {state:x?} was loaded"),
        }
        loaded += 1;
        // What KVM holds now, read back from the vCPU (only while rip is in user memory).
        if state.rip < USER_BASE {
            continue;
        }
        let held = cpu
            .interrupted_state()
            .unwrap()
            .expect("rip is in user memory");
        assert_eq!(
            (
                held.rip,
                held.regs.rsp,
                held.rflags,
                held.fs_base,
                held.gs_base
            ),
            (
                state.rip,
                state.regs.rsp,
                user_rflags(state.rflags),
                state.fs_base,
                state.gs_base
            ),
            "case {case}"
        );
    }
    eprintln!("{loaded} states loaded, {refused} refused");
    assert!(loaded > 0 && refused > 0, "both kinds of state were tried");
}
