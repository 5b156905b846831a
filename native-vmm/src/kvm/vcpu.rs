//! `KvmCpu`: a VM with memory slots for what the program was handed and one vCPU, set up for long mode at
//! CPL3 on the `arch` tables, implementing `GuestCpu`.
//!
//! Exit path: the CPL0 stubs stop the vCPU with an `out` to SYSCALL_PORT or EXCEPTION_PORT.
//! On a syscall exit the registers (rax and the six arguments) are read from the run page,
//! where KVM stores them at every return from KVM_RUN (KVM_CAP_SYNC_REGS), and the answer goes
//! back the same way, loaded by KVM at the next KVM_RUN's entry: no ioctl besides KVM_RUN per
//! system call (without the capability: one KVM_GET_REGS and one KVM_SET_REGS). rip is left
//! alone, so KVM finishes the `out` on the next KVM_RUN and the stub goes on to `iretq`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use super::abi::*;
use super::reaper::{self, Reaped};
use super::run_page::RunPage;
use super::spare::{self, Blank};
use super::watchdog::Watchdog;
use super::{context, Kvm};
use crate::arch::cpu_state::{self, CpuFeatures};
use crate::arch::descriptors::{Segment, GDT_LIMIT, IDT_LIMIT};
use crate::arch::stubs::{ExceptionFrame, EXCEPTION_FRAME, FRAME_RFLAGS, FRAME_RIP, FRAME_RSP};
use crate::arch::{self, paging, EXCEPTION_PORT, GDT_ADDR, IDT_ADDR, SYSCALL_PORT};
use crate::cpu::{
    user_rflags, CpuExit, CpuSnapshot, GuestCpu, UserRegs, USER_ADDRESS_LIMIT, XSAVE_MIN_BYTES,
    XSAVE_XCOMP_BV, XSAVE_XSTATE_BV,
};
use crate::layout::{PAGE_SIZE, VVAR_ADDR};
use crate::memory::{GuestMemory, PageSet};
use crate::status::GuestFault;
use crate::sys;

const GENERAL_PROTECTION: u8 = 13;
const PAGE_FAULT: u8 = 14;
/// Page-fault error code bits: a page was present; a write; from CPL3.
const PF_PRESENT: u64 = 1;
const PF_WRITE: u64 = 1 << 1;
const PF_USER: u64 = 1 << 2;
/// KVM_EXIT_INTERNAL_ERROR's suberror for an instruction KVM could not emulate.
const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;
/// The FS and GS base MSRs.
const MSR_FS_BASE: u32 = 0xc000_0100;
const MSR_GS_BASE: u32 = 0xc000_0101;

/// A KVM vCPU running one guest program. It borrows the guest memory it was built on: the VM's
/// memory slot points into that mapping, so the memory must outlive the VM.
pub struct KvmCpu<'m> {
    // Field order is drop order: the watchdog entry (whose `on_fire` writes into the run page)
    // is removed before the run page is unmapped.
    watchdog: Watchdog,
    /// The run page, the vCPU and its VM: closed on the reaper thread (destroying a VM is a
    /// quarter of a fork's cost).
    handles: Reaped<VmHandles>,
    /// The guest-physical range of each memory slot, by slot number (None: free).
    slots: Vec<Option<(u64, u64)>>,
    /// What the guest may reach (`slot_ranges` of the last `map_memory`). With `slots_on_touch`
    /// only the system area is in a slot from the start; the rest of each range gets its slot
    /// when the guest first touches it.
    reachable: Vec<(u64, u64)>,
    /// KVM reports every access outside the slots to us (MMIO exits, and emulation failures
    /// rather than a #UD in the guest), so slots can wait for the first touch.
    slots_on_touch: bool,
    /// Exits `handle_exit` answered itself since `take_inner_exits`.
    inner_exits: u64,
    /// The general registers travel through the run page (KVM_CAP_SYNC_REGS), not ioctls.
    sync_regs: bool,
    /// The registers as of the last syscall exit; `set_syscall_return` writes them back.
    regs: KvmRegs,
    /// The vCPU is stopped in a system call: `set_syscall_return` may set rax.
    in_syscall: bool,
    /// Where the program's rip, rsp and rflags are while `in_syscall`: in `regs` (the vCPU was
    /// put at CPL3 by `restore`, `reset` or `load_thread`), or in the syscall stub's iretq
    /// frame (it stopped at the stub's `out`).
    user_state_in_regs: bool,
    /// The program's registers at the instruction that faulted (rip, rsp and rflags included),
    /// from the last run's fault exit until `fault_state` takes them.
    fault_regs: Option<KvmRegs>,
    /// The vCPU stopped in a fault (in the exception stub, or in an access KVM was emulating)
    /// and was not put back at CPL3 since: the next `load_thread` loads the whole user state.
    after_fault: bool,
    /// The guest memory the VM's slot maps (snapshots read the stub's return frame in it).
    mem: &'m GuestMemory,
    /// With `track_writes`: KVM logs the guest's writes in every slot (KVM_MEM_LOG_DIRTY_PAGES),
    /// and this holds what the logs of slots deleted since `take_written_pages` said.
    written: Option<PageSet>,
}

/// What the kernel holds for one VM, in drop order.
struct VmHandles {
    run_page: RunPage,
    vcpu: OwnedFd,
    /// The VM the vCPU belongs to (its memory slots change as the program is handed memory).
    vm: OwnedFd,
}

/// The user state a vCPU starts from besides its general registers.
struct UserState<'a> {
    fs_base: u64,
    gs_base: u64,
    /// A standard-layout XSAVE area to load (None: the reset state).
    xsave: Option<&'a [u8]>,
}

impl<'m> KvmCpu<'m> {
    /// Writes the `arch` tables into the system area of `mem`, creates the VM and its vCPU,
    /// and points the vCPU at `entry` with `stack_pointer` in rsp (other registers 0), at CPL3.
    pub fn new(mem: &'m GuestMemory, entry: u64, stack_pointer: u64) -> io::Result<KvmCpu<'m>> {
        let regs = KvmRegs {
            gprs: UserRegs {
                rsp: stack_pointer,
                ..Default::default()
            },
            rip: entry,
            rflags: cpu_state::USER_RFLAGS,
        };
        KvmCpu::create(
            mem,
            true,
            regs,
            &UserState {
                fs_base: 0,
                gs_base: 0,
                xsave: None,
            },
        )
    }

    /// A vCPU in the state `snapshot` recorded, on `mem`: a copy-on-write fork of a template
    /// whose memory already holds the `arch` tables (`snapshot::Template` writes them into the
    /// template once, so a fork copies none of those pages). The first `run` resumes the
    /// program after the system call the snapshot was taken in, with rax as given to
    /// `set_syscall_return` (the snapshot's rax until then).
    ///
    /// How: the snapshot was taken at CPL0, at the syscall stub's `out`; rather than recreate
    /// that (KVM keeps the pending `out` in state no ioctl restores), the vCPU starts directly
    /// at CPL3 where the stub's `iretq` would have returned: rip, rsp and rflags from the
    /// snapshot, the user segments `new` also uses (iretq loads the same ones), every general
    /// register as the program left it (rcx and r11 hold rip and rflags, as after a Linux
    /// sysret), FS/GS bases, and the XSAVE area. This is the same kind of entry as a fresh
    /// VM's first instruction, so it takes no CPL0 instruction at all.
    pub fn restore(mem: &'m GuestMemory, snapshot: &CpuSnapshot) -> io::Result<KvmCpu<'m>> {
        let (regs, user) = snapshot_state(snapshot)?;
        let mut cpu = KvmCpu::create(mem, false, regs, &user)?;
        // Stopped "inside" the pending system call: its return value may be set before the
        // first run, and `regs` holds exactly what KVM has.
        cpu.in_syscall = true;
        cpu.user_state_in_regs = true;
        Ok(cpu)
    }

    /// Creates the VM (one slot: all of `mem`) and its vCPU in long mode at CPL3 with `regs`;
    /// `install_tables` writes the `arch` tables into `mem` first (a fork has them already).
    fn create(
        mem: &'m GuestMemory,
        install_tables: bool,
        regs: KvmRegs,
        user: &UserState,
    ) -> io::Result<KvmCpu<'m>> {
        paging::check_memory_size(mem.size())?;
        let kvm = Kvm::shared()?;
        reaper::start();
        let Blank {
            vm,
            vcpu,
            run_page,
            slots_on_touch,
            tsc_aligned,
        } = spare::take(kvm)?;
        if install_tables {
            arch::install(mem)?;
        }
        // The vDSO reads the TSC as the host's: only then does it get the clock's data page.
        if tsc_aligned {
            crate::vdso::clock::show_in(mem)?;
        }
        let reset_sregs = kvm.reset_sregs(|| get_sregs(&vcpu))?;
        load_state(&vcpu, &kvm.features, reset_sregs, user)?;
        if kvm.sync_regs {
            run_page.keep_regs_synced();
        }

        let exit_flag = run_page.exit_flag();
        let watchdog = Watchdog::start(Box::new(move || exit_flag.raise()))?;
        let handles = Reaped::new(VmHandles { run_page, vcpu, vm });
        // No memory slot yet: `map_memory` creates them all at once (every run starts with it).
        let cpu = KvmCpu {
            watchdog,
            handles,
            slots: Vec::new(),
            reachable: Vec::new(),
            slots_on_touch,
            inner_exits: 0,
            sync_regs: kvm.sync_regs,
            regs,
            in_syscall: false,
            user_state_in_regs: false,
            fault_regs: None,
            after_fault: false,
            mem,
            written: None,
        };
        cpu.put_regs(&regs)?;
        Ok(cpu)
    }

    /// Creates (a range) or deletes (None) memory slot `slot`. A slot's write log is taken
    /// before it is deleted (it goes with the slot).
    fn set_slot(&mut self, slot: usize, range: Option<(u64, u64)>) -> io::Result<()> {
        if range.is_none() {
            self.take_slot_log(slot)?;
        }
        let (start, end) = range.unwrap_or((0, 0));
        let userspace_addr = if range.is_some() {
            self.mem.host_base() + start
        } else {
            0
        };
        let flags = if self.written.is_some() {
            KVM_MEM_LOG_DIRTY_PAGES
        } else {
            0
        };
        let region = KvmUserspaceMemoryRegion {
            slot: slot as u32,
            flags,
            guest_phys_addr: start,
            memory_size: end - start,
            userspace_addr,
        };
        sys::ioctl_ref(
            self.handles.vm.as_raw_fd(),
            KVM_SET_USER_MEMORY_REGION,
            &region,
        )
        .map_err(context("KVM_SET_USER_MEMORY_REGION"))?;
        if self.slots.len() <= slot {
            self.slots.resize(slot + 1, None);
        }
        self.slots[slot] = range;
        Ok(())
    }

    /// Adds the pages the guest wrote in slot `slot` since its log was last taken to `written`
    /// (KVM_GET_DIRTY_LOG, which also clears the log); nothing when writes are not tracked.
    fn take_slot_log(&mut self, slot: usize) -> io::Result<()> {
        let (Some(written), Some(Some((start, end)))) = (&mut self.written, self.slots.get(slot))
        else {
            return Ok(());
        };
        let pages = ((end - start) / PAGE_SIZE) as usize;
        let mut bitmap = vec![0u64; pages.div_ceil(64)];
        let log = KvmDirtyLog {
            slot: slot as u32,
            padding: 0,
            dirty_bitmap: bitmap.as_mut_ptr() as u64,
        };
        sys::ioctl_ref(self.handles.vm.as_raw_fd(), KVM_GET_DIRTY_LOG, &log)
            .map_err(context("KVM_GET_DIRTY_LOG"))?;
        let first = (start / PAGE_SIZE) as usize;
        for (i, &word) in bitmap.iter().enumerate().filter(|(_, &word)| word != 0) {
            (0..64)
                .filter(|bit| word >> bit & 1 != 0)
                .for_each(|bit| written.insert(first + i * 64 + bit));
        }
        Ok(())
    }

    /// The vCPU's general registers: as KVM stored them at the last return from KVM_RUN, or as
    /// `put_regs` left them for the next.
    fn get_regs(&self) -> io::Result<KvmRegs> {
        if self.sync_regs {
            return Ok(self.handles.run_page.regs());
        }
        let mut regs = KvmRegs::default();
        sys::ioctl_mut(self.handles.vcpu.as_raw_fd(), KVM_GET_REGS, &mut regs)
            .map_err(context("KVM_GET_REGS"))?;
        Ok(regs)
    }

    fn get_sregs(&self) -> io::Result<KvmSregs> {
        get_sregs(&self.handles.vcpu)
    }

    /// Sets the vCPU's general registers (with sync regs: at the next KVM_RUN's entry).
    fn put_regs(&self, regs: &KvmRegs) -> io::Result<()> {
        if self.sync_regs {
            self.handles.run_page.put_regs(regs);
            return Ok(());
        }
        sys::ioctl_ref(self.handles.vcpu.as_raw_fd(), KVM_SET_REGS, regs)
            .map_err(context("KVM_SET_REGS"))?;
        Ok(())
    }

    /// The program's state with `regs` as its registers, rip and rflags: FS/GS bases and the
    /// XSAVE area from the vCPU.
    fn user_state(&self, regs: KvmRegs) -> io::Result<CpuSnapshot> {
        let sregs = self.get_sregs()?;
        let mut area = KvmXsave::zeroed();
        sys::ioctl_mut(self.handles.vcpu.as_raw_fd(), KVM_GET_XSAVE, &mut area)
            .map_err(context("KVM_GET_XSAVE"))?;
        Ok(CpuSnapshot {
            regs: regs.gprs,
            rip: regs.rip,
            rflags: regs.rflags,
            fs_base: sregs.fs.base,
            gs_base: sregs.gs.base,
            xsave: area.to_bytes(),
        })
    }

    /// Keeps `regs`, the program's at the instruction that faulted, for `fault_state`; their rip.
    fn fault_at(&mut self, regs: KvmRegs) -> u64 {
        self.fault_regs = Some(regs);
        regs.rip
    }

    /// The exception stub's frame, on the exception stack at `rsp` (bounds-checked reads of
    /// the system area; anywhere else the stubs themselves went wrong).
    fn exception_frame(&self, rsp: u64) -> io::Result<ExceptionFrame> {
        if rsp != EXCEPTION_FRAME {
            return Err(io::Error::other(format!(
                "the exception stub stopped with rsp {rsp:#x}, not at its frame"
            )));
        }
        let mut words = [0u64; 7];
        for (i, word) in words.iter_mut().enumerate() {
            *word = self.mem.read_u64(rsp + 8 * i as u64).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("reading the exception frame: {e}"),
                )
            })?;
        }
        Ok(ExceptionFrame::from_words(words))
    }

    /// Lets KVM finish the exit the vCPU stopped in (the stub's `out`, an access it emulates)
    /// without running the guest: KVM_RUN with `immediate_exit` completes it and returns EINTR.
    /// A state loaded afterwards is then not overwritten by the completion. An access KVM
    /// splits finishes piece by piece, each piece another exit.
    fn finish_exit(&mut self) -> io::Result<()> {
        for _ in 0..8 {
            self.handles.run_page.exit_flag().raise();
            let result = sys::ioctl_val(self.handles.vcpu.as_raw_fd(), KVM_RUN, 0);
            self.handles.run_page.clear_immediate_exit();
            match result {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
                Err(e) => return Err(context("KVM_RUN")(e)),
                Ok(_) if self.handles.run_page.exit_reason() == KVM_EXIT_MMIO => {}
                Ok(_) => break,
            }
        }
        Err(io::Error::other(
            "KVM did not finish the exit of a fault without running the guest",
        ))
    }

    /// Gives guest memory in `[start, end)` that no slot covers slots of its own; true if it
    /// made any.
    fn fill_slots(&mut self, start: u64, end: u64) -> io::Result<bool> {
        let mut covered: Vec<(u64, u64)> = self
            .slots
            .iter()
            .flatten()
            .copied()
            .filter(|&(s, e)| s < end && e > start)
            .collect();
        covered.sort_unstable();
        let (mut at, mut made) = (start, false);
        for (s, e) in covered.into_iter().chain(std::iter::once((end, end))) {
            if s > at {
                let free = self
                    .slots
                    .iter()
                    .position(Option::is_none)
                    .unwrap_or(self.slots.len());
                self.set_slot(free, Some((at, s)))?;
                made = true;
            }
            at = at.max(e);
        }
        Ok(made)
    }

    /// Every reachable range in slots; true if any was missing.
    fn fill_all_slots(&mut self) -> io::Result<bool> {
        let mut made = false;
        for (start, end) in self.reachable.clone() {
            made |= self.fill_slots(start, end)?;
        }
        Ok(made)
    }

    /// An MMIO exit at reachable memory is the guest's first touch of a range waiting for its
    /// slot (or a later piece of the same instruction's access): the range gets its slot and
    /// the access is completed on guest memory, as the guest would have done it. False if the
    /// access is outside what the guest may reach.
    fn complete_first_touch(
        &mut self,
        mmio: &MmioExit,
        data: &[u8; EXIT_DATA_SIZE],
    ) -> io::Result<bool> {
        let len = mmio.len as usize;
        let end = mmio.phys_addr.saturating_add(u64::from(mmio.len));
        let Some(&(start, range_end)) = self
            .reachable
            .iter()
            .find(|&&(s, e)| s <= mmio.phys_addr && end <= e)
        else {
            return Ok(false);
        };
        if len == 0 || len > MmioExit::MAX_LEN {
            return Ok(false);
        }
        self.fill_slots(start, range_end)?;
        let bytes = MmioExit::DATA_OFFSET..MmioExit::DATA_OFFSET + len;
        let invalid = |e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("completing a first touch: {e}"),
            )
        };
        if mmio.is_write {
            self.mem
                .write(mmio.phys_addr, &data[bytes])
                .map_err(invalid)?;
        } else {
            let mut read = [0u8; MmioExit::MAX_LEN];
            self.mem
                .read(mmio.phys_addr, &mut read[..len])
                .map_err(invalid)?;
            self.handles.run_page.set_mmio_data(&read[..len]);
        }
        Ok(true)
    }

    /// Turns the exit KVM_RUN just reported into a `CpuExit`, or None when it was handled here
    /// (a first touch of memory waiting for its slot) and the guest goes on.
    fn handle_exit(&mut self) -> io::Result<Option<CpuExit>> {
        Ok(Some(match self.handles.run_page.exit_reason() {
            KVM_EXIT_MMIO => {
                let data = self.handles.run_page.exit_data();
                let mmio = MmioExit::decode(&data);
                if self.complete_first_touch(&mmio, &data)? {
                    return Ok(None);
                }
                // Guest memory outside every slot: memory the program was never handed.
                let rip = self.fault_at(self.get_regs()?);
                let error_code = PF_USER | if mmio.is_write { PF_WRITE } else { 0 };
                CpuExit::Fault(GuestFault {
                    vector: PAGE_FAULT,
                    error_code,
                    rip,
                    address: Some(mmio.phys_addr),
                })
            }
            KVM_EXIT_INTERNAL_ERROR
                if InternalError::decode(&self.handles.run_page.exit_data()).suberror
                    == KVM_INTERNAL_ERROR_EMULATION =>
            {
                // KVM emulates an instruction only when it touches memory outside every slot;
                // one it cannot emulate (an instruction fetch, AVX-512) ends up here, its rip
                // unchanged. If reachable memory was waiting for its slots, they are made and
                // the instruction runs again; otherwise the program reached memory it was
                // never handed: a page fault.
                if self.fill_all_slots()? {
                    return Ok(None);
                }
                let rip = self.fault_at(self.get_regs()?);
                CpuExit::Fault(GuestFault {
                    vector: PAGE_FAULT,
                    error_code: PF_USER,
                    rip,
                    address: None,
                })
            }
            _ => return self.handle_other_exit().map(Some),
        }))
    }

    /// `handle_exit` for the exits memory slots have no part in.
    fn handle_other_exit(&mut self) -> io::Result<CpuExit> {
        let reason = self.handles.run_page.exit_reason();
        let data = self.handles.run_page.exit_data();
        match reason {
            KVM_EXIT_IO => {
                let io = IoExit::decode(&data);
                match (io.direction, io.port) {
                    (KVM_EXIT_IO_OUT, SYSCALL_PORT) => {
                        self.regs = self.get_regs()?;
                        self.in_syscall = true;
                        // The stub's `out` leaves the program's rip, rsp and rflags in its
                        // frame; an `out` in the program's own code (which the I/O bitmap
                        // allows where the stub runs at CPL3) leaves them in the registers, and
                        // whatever the program wrote into the frame is not its state.
                        self.user_state_in_regs = self.regs.rip >= crate::layout::USER_BASE;
                        Ok(syscall_exit(&self.regs.gprs))
                    }
                    (KVM_EXIT_IO_OUT, EXCEPTION_PORT) => {
                        let regs = self.get_regs()?;
                        let frame = self.exception_frame(regs.gprs.rsp)?;
                        let cr2 = if frame.vector == u64::from(PAGE_FAULT) {
                            Some(self.get_sregs()?.cr2)
                        } else {
                            None
                        };
                        let exit = fault_exit(frame, cr2)?;
                        // The stub changed rsp alone; the CPU's frame holds the program's.
                        self.fault_at(KvmRegs {
                            gprs: UserRegs {
                                rsp: frame.rsp,
                                ..regs.gprs
                            },
                            rip: frame.rip,
                            rflags: frame.rflags,
                        });
                        Ok(exit)
                    }
                    // The I/O bitmap lets CPL3 reach SYSCALL_PORT (the stub runs at CPL3 on
                    // PVM), so the program's own code can `in` from it too: an I/O access the
                    // VMM does not serve is the general protection fault any other port gets.
                    _ => Ok(CpuExit::Fault(GuestFault {
                        vector: GENERAL_PROTECTION,
                        error_code: 0,
                        rip: self.fault_at(self.get_regs()?),
                        address: None,
                    })),
                }
            }
            KVM_EXIT_SHUTDOWN => {
                let rip = self
                    .get_regs()
                    .map_or_else(|e| format!("unknown: {e}"), |r| format!("{:#x}", r.rip));
                Err(io::Error::other(format!("the guest triple-faulted (KVM_EXIT_SHUTDOWN, rip {rip}): the CPL0 exception path itself failed")))
            }
            KVM_EXIT_FAIL_ENTRY => {
                let fail = FailEntry::decode(&data);
                Err(io::Error::other(format!(
                    "KVM could not enter the guest (KVM_EXIT_FAIL_ENTRY, hardware reason {:#x} on cpu {}): the vCPU state is invalid",
                    fail.hardware_entry_failure_reason, fail.cpu
                )))
            }
            KVM_EXIT_INTERNAL_ERROR => {
                let internal = InternalError::decode(&data);
                Err(io::Error::other(format!(
                    "KVM internal error {} ({}), data {:x?}",
                    internal.suberror,
                    internal.suberror_name(),
                    internal.data
                )))
            }
            KVM_EXIT_HLT => Err(io::Error::other(
                "the vCPU halted: it was run again after reporting a fault",
            )),
            other => Err(io::Error::other(format!(
                "unexpected KVM exit {other} ({})",
                exit_reason_name(other)
            ))),
        }
    }
}

impl GuestCpu for KvmCpu<'_> {
    fn run(&mut self, deadline: Instant) -> io::Result<CpuExit> {
        self.in_syscall = false;
        self.fault_regs = None;
        loop {
            if !self.watchdog.arm(deadline) {
                return Ok(CpuExit::DeadlineReached);
            }
            let result = sys::ioctl_val(self.handles.vcpu.as_raw_fd(), KVM_RUN, 0);
            self.watchdog.disarm();
            self.handles.run_page.clear_immediate_exit();
            match result {
                // The watchdog's kick (or another signal): `arm` tells whether time is up.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(context("KVM_RUN")(e)),
                Ok(_) => match self.handle_exit()? {
                    Some(exit) => return Ok(exit),
                    None => self.inner_exits += 1,
                },
            }
        }
    }

    fn set_syscall_return(&mut self, value: u64) -> io::Result<()> {
        if !self.in_syscall {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "set_syscall_return: the vCPU is not stopped in a system call",
            ));
        }
        self.regs.gprs.rax = value;
        self.put_regs(&self.regs)
    }

    /// At a syscall exit the vCPU is at CPL0 in the stub, on the syscall stack: rip, rsp and
    /// rflags of the program are in the stub's iretq frame (arch::stubs), every other general
    /// register still holds the program's value.
    fn snapshot(&mut self) -> io::Result<CpuSnapshot> {
        if !self.in_syscall {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "snapshot: the vCPU is not stopped in a system call",
            ));
        }
        if self.user_state_in_regs {
            return self.user_state(self.regs);
        }
        let frame = |addr: u64| {
            self.mem.read_u64(addr).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("reading the syscall frame: {e}"),
                )
            })
        };
        let (rip, rflags, rsp) = (frame(FRAME_RIP)?, frame(FRAME_RFLAGS)?, frame(FRAME_RSP)?);
        // The stub runs on its own stack: the program's rsp is the one in the frame.
        self.user_state(KvmRegs {
            gprs: UserRegs {
                rsp,
                ..self.regs.gprs
            },
            rip,
            rflags,
        })
    }

    fn take_inner_exits(&mut self) -> u64 {
        std::mem::take(&mut self.inner_exits)
    }

    fn switches_threads(&self) -> bool {
        true
    }

    fn can_fork(&self) -> bool {
        true
    }

    fn fork_onto<'n>(
        &self,
        mem: &'n GuestMemory,
        state: &CpuSnapshot,
    ) -> io::Result<Box<dyn GuestCpu + 'n>> {
        Ok(Box::new(KvmCpu::restore(mem, state)?))
    }

    fn exec_onto<'n>(
        &self,
        mem: &'n GuestMemory,
        entry: u64,
        stack_pointer: u64,
    ) -> io::Result<Box<dyn GuestCpu + 'n>> {
        Ok(Box::new(KvmCpu::new(mem, entry, stack_pointer)?))
    }

    /// Another thread's state without KVM_SET_SREGS (which resets KVM's MMU context: a full
    /// shadow-page-table rebuild on PVM): the vCPU is already at CPL3 or in the syscall stub,
    /// so only the registers, the FS/GS bases (as MSRs) and the vector state change. In the
    /// stub, the thread's rip, rsp and rflags go into the stub's iretq frame (whose CS and SS
    /// the stub wrote on entry) and the stub's `iretq` returns to it; at CPL3 they go straight
    /// into the registers.
    /// Parts of the state can come from guest memory (the user-writable iretq frame, a signal
    /// handler's address): `CpuSnapshot::check_user` runs first, and rflags keep only what CPL3
    /// controls.
    fn load_thread(&mut self, state: &CpuSnapshot) -> io::Result<()> {
        if std::mem::take(&mut self.after_fault) {
            // Segments too: the vCPU may be at CPL0 in the exception stub.
            return self.reset(state);
        }
        state
            .check_user()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if state.xsave.len() < XSAVE_MIN_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a thread's XSAVE area is shorter than its header",
            ));
        }
        let regs = KvmRegs {
            gprs: state.regs,
            rip: state.rip,
            rflags: user_rflags(state.rflags),
        };
        let features = &Kvm::shared()?.features;
        let bases = [(MSR_FS_BASE, state.fs_base), (MSR_GS_BASE, state.gs_base)];
        let mut msrs = KvmMsrs {
            nmsrs: 2,
            pad: 0,
            entries: [KvmMsrEntry::default(); 2],
        };
        for (entry, (index, data)) in msrs.entries.iter_mut().zip(bases) {
            *entry = KvmMsrEntry {
                index,
                reserved: 0,
                data,
            };
        }
        if sys::ioctl_ref(self.handles.vcpu.as_raw_fd(), KVM_SET_MSRS, &msrs)
            .map_err(context("KVM_SET_MSRS"))?
            != 2
        {
            return Err(io::Error::other(
                "KVM_SET_MSRS rejected the thread's FS/GS base",
            ));
        }
        let area = xsave_for_guest(&state.xsave, features.restored_state());
        sys::ioctl_ref(self.handles.vcpu.as_raw_fd(), KVM_SET_XSAVE, &area)
            .map_err(context("KVM_SET_XSAVE"))?;
        let loaded = if self.in_syscall && !self.user_state_in_regs {
            let frame = |addr: u64, value: u64| {
                self.mem.write_u64(addr, value).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("writing the syscall frame: {e}"),
                    )
                })
            };
            frame(FRAME_RIP, regs.rip)?;
            frame(FRAME_RFLAGS, regs.rflags)?;
            frame(FRAME_RSP, regs.gprs.rsp)?;
            // The stub's own rip (at its `out`), rsp (the frame) and rflags stay.
            KvmRegs {
                gprs: UserRegs {
                    rsp: self.regs.gprs.rsp,
                    ..regs.gprs
                },
                ..self.regs
            }
        } else {
            self.user_state_in_regs = true;
            regs
        };
        self.put_regs(&loaded)?;
        self.regs = loaded;
        self.in_syscall = true;
        Ok(())
    }

    /// The state is read before KVM finishes the exit: finishing an emulated read writes its
    /// (meaningless) value into the destination register and moves rip past the access.
    fn fault_state(&mut self) -> io::Result<Option<CpuSnapshot>> {
        let Some(regs) = self.fault_regs.take() else {
            return Ok(None);
        };
        let state = self.user_state(regs)?;
        self.finish_exit()?;
        self.after_fault = true;
        Ok(Some(state))
    }

    /// The registers KVM holds are the program's when rip is in user memory; below it the
    /// vCPU is in the stubs (syscall entry or exception path), which reach their `out` within
    /// a few instructions.
    fn interrupted_state(&mut self) -> io::Result<Option<CpuSnapshot>> {
        let regs = self.get_regs()?;
        if regs.rip < crate::layout::USER_BASE {
            return Ok(None);
        }
        self.user_state(regs).map(Some)
    }

    /// The same state `restore` loads into a new vCPU, loaded into this one. A pending `out`
    /// of the last run is dropped with it: KVM completes a port write on the next KVM_RUN only
    /// while rip still points at it.
    fn reset(&mut self, snapshot: &CpuSnapshot) -> io::Result<()> {
        let (regs, user) = snapshot_state(snapshot)?;
        let kvm = Kvm::shared()?;
        // Read when this vCPU was made: a used vCPU's own would carry its last run's CR2.
        let reset_sregs =
            kvm.reset_sregs(|| Err(io::Error::other("no new vCPU's registers were recorded")))?;
        load_state(&self.handles.vcpu, &kvm.features, reset_sregs, &user)?;
        self.put_regs(&regs)?;
        self.regs = regs;
        self.in_syscall = true;
        self.user_state_in_regs = true;
        Ok(())
    }

    /// Memory slots cover exactly `ranges` rounded out to 2 MiB, plus the first 2 MiB (the
    /// system area and the page tables). Nothing else of guest memory is in a slot, so KVM
    /// allocates its per-page bookkeeping (~12 bytes a page on a shadow-paging backend such as
    /// PVM: reverse map and write tracking) only for memory the program was handed, and an
    /// access outside it exits as MMIO, which `handle_exit` reports as a page fault. Slots no
    /// longer wanted are deleted first (after a reset to a template that was handed less); new
    /// ones fill the gaps: the system area's at once, the others, where KVM reports every
    /// access outside the slots (`slots_on_touch`), when the guest first touches their range,
    /// so a VM that never runs (an idle fork) holds no bookkeeping for the program's memory.
    fn map_memory(&mut self, ranges: &[(u64, u64)]) -> io::Result<()> {
        let wanted = slot_ranges(ranges, self.mem.size());
        for slot in 0..self.slots.len() {
            if let Some((start, end)) = self.slots[slot] {
                if !wanted.iter().any(|&(s, e)| s <= start && end <= e) {
                    self.set_slot(slot, None)?;
                }
            }
        }
        self.reachable = wanted;
        if self.slots_on_touch {
            self.fill_slots(0, paging::LARGE_PAGE_SIZE.min(self.mem.size()))?;
        } else {
            self.fill_all_slots()?;
        }
        Ok(())
    }

    /// Slots get KVM_MEM_LOG_DIRTY_PAGES (those there already are registered again with it).
    fn track_writes(&mut self) -> io::Result<bool> {
        if self.written.is_none() {
            self.written = Some(PageSet::with_capacity(
                (self.mem.size() / PAGE_SIZE) as usize,
            ));
            for slot in 0..self.slots.len() {
                if let Some(range) = self.slots[slot] {
                    self.set_slot(slot, Some(range))?;
                }
            }
        }
        Ok(true)
    }

    fn take_written_pages(&mut self) -> io::Result<Option<PageSet>> {
        if self.written.is_none() {
            return Ok(None);
        }
        for slot in 0..self.slots.len() {
            self.take_slot_log(slot)?;
        }
        let pages = (self.mem.size() / PAGE_SIZE) as usize;
        Ok(self.written.replace(PageSet::with_capacity(pages)))
    }

    fn set_fs_base(&mut self, base: u64) -> io::Result<()> {
        if base >= USER_ADDRESS_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("FS base {base:#x} is not a user address"),
            ));
        }
        let mut sregs = self.get_sregs()?;
        sregs.fs.base = base;
        sys::ioctl_ref(self.handles.vcpu.as_raw_fd(), KVM_SET_SREGS, &sregs)
            .map_err(context("KVM_SET_SREGS"))?;
        Ok(())
    }
}

/// The registers and user state a vCPU resumes `snapshot` with, after checking what KVM would
/// otherwise refuse (or fault on) later.
fn snapshot_state(snapshot: &CpuSnapshot) -> io::Result<(KvmRegs, UserState<'_>)> {
    snapshot
        .check_user()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("snapshot state: {e}")))?;
    if snapshot.xsave.len() < XSAVE_MIN_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "snapshot XSAVE area of {} bytes is shorter than its header",
                snapshot.xsave.len()
            ),
        ));
    }
    let regs = KvmRegs {
        gprs: snapshot.regs,
        rip: snapshot.rip,
        rflags: user_rflags(snapshot.rflags),
    };
    Ok((
        regs,
        UserState {
            fs_base: snapshot.fs_base,
            gs_base: snapshot.gs_base,
            xsave: Some(&snapshot.xsave),
        },
    ))
}

/// Loads every piece of vCPU state the guest can reach into `vcpu` (after KVM_SET_CPUID2):
/// segments and control registers, XCR0, the vector state, the syscall MSRs and `regs`.
fn load_state(
    vcpu: &OwnedFd,
    features: &CpuFeatures,
    reset_sregs: KvmSregs,
    user: &UserState,
) -> io::Result<()> {
    set_sregs(vcpu, features, reset_sregs, user)?;
    if let Some(xcr0) = features.xcr0() {
        let mut xcrs = KvmXcrs {
            nr_xcrs: 1,
            ..Default::default()
        };
        xcrs.xcrs[0] = KvmXcr {
            xcr: 0,
            reserved: 0,
            value: xcr0,
        };
        sys::ioctl_ref(vcpu.as_raw_fd(), KVM_SET_XCRS, &xcrs).map_err(context("KVM_SET_XCRS"))?;
    }
    // None only for a new vCPU starting a program, whose vector state is the reset state.
    if let Some(area) = user.xsave {
        let area = xsave_for_guest(area, features.restored_state());
        sys::ioctl_ref(vcpu.as_raw_fd(), KVM_SET_XSAVE, &area).map_err(context("KVM_SET_XSAVE"))?;
    }
    set_msrs(vcpu)
}

/// `ranges` rounded out to 2 MiB boundaries within a memory of `size` bytes, with the first
/// 2 MiB, merged and sorted: the guest memory the memory slots cover, all the guest can reach.
pub fn slot_ranges(ranges: &[(u64, u64)], size: u64) -> Vec<(u64, u64)> {
    let align = paging::LARGE_PAGE_SIZE;
    let mut rounded: Vec<(u64, u64)> = std::iter::once((0, align))
        .chain(
            ranges
                .iter()
                .map(|&(s, e)| (s / align * align, e.div_ceil(align) * align)),
        )
        .map(|(s, e)| (s.min(size), e.min(size)))
        .filter(|(s, e)| s < e)
        .collect();
    rounded.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in rounded {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
}

fn get_sregs(vcpu: &OwnedFd) -> io::Result<KvmSregs> {
    let mut sregs = KvmSregs::default();
    sys::ioctl_mut(vcpu.as_raw_fd(), KVM_GET_SREGS, &mut sregs)
        .map_err(context("KVM_GET_SREGS"))?;
    Ok(sregs)
}

/// Long mode with paging on the arch tables, CPL3 segments. Starts from a new vCPU's reset
/// state (`Kvm::reset_sregs`) so fields this backend does not care about (LDT, APIC base) keep
/// KVM's defaults, and a reset vCPU keeps nothing of its last run (CR2).
fn set_sregs(
    vcpu: &OwnedFd,
    features: &CpuFeatures,
    reset_sregs: KvmSregs,
    user: &UserState,
) -> io::Result<()> {
    let mut sregs = reset_sregs;
    let segments = cpu_state::user_segments();
    let data = kvm_segment(&segments.data);
    sregs.cs = kvm_segment(&segments.cs);
    (sregs.ss, sregs.ds, sregs.es, sregs.fs, sregs.gs) = (data, data, data, data, data);
    (sregs.fs.base, sregs.gs.base) = (user.fs_base, user.gs_base);
    sregs.tr = kvm_segment(&segments.tr);
    sregs.gdt = KvmDtable {
        base: GDT_ADDR,
        limit: GDT_LIMIT,
        padding: [0; 3],
    };
    sregs.idt = KvmDtable {
        base: IDT_ADDR,
        limit: IDT_LIMIT,
        padding: [0; 3],
    };
    sregs.cr0 = cpu_state::CR0;
    sregs.cr3 = cpu_state::CR3;
    sregs.cr4 = features.cr4();
    sregs.efer = cpu_state::EFER;
    sys::ioctl_ref(vcpu.as_raw_fd(), KVM_SET_SREGS, &sregs).map_err(context("KVM_SET_SREGS"))?;
    Ok(())
}

/// A snapshot's XSAVE area as KVM_SET_XSAVE takes it: standard layout (XCOMP_BV zero), and
/// only the `components` KVM holds for the guest marked as holding state.
fn xsave_for_guest(area: &[u8], components: u64) -> KvmXsave {
    let mut bytes = area[..area.len().min(KvmXsave::BYTES)].to_vec();
    if bytes.len() >= XSAVE_MIN_BYTES {
        let mut bv = [0u8; 8];
        bv.copy_from_slice(&bytes[XSAVE_XSTATE_BV..XSAVE_XSTATE_BV + 8]);
        let kept = u64::from_le_bytes(bv) & components;
        bytes[XSAVE_XSTATE_BV..XSAVE_XSTATE_BV + 8].copy_from_slice(&kept.to_le_bytes());
        bytes[XSAVE_XCOMP_BV..XSAVE_XCOMP_BV + 8].fill(0);
    }
    KvmXsave::from_bytes(&bytes)
}

fn set_msrs(vcpu: &OwnedFd) -> io::Result<()> {
    let mut msrs = KvmMsrs {
        nmsrs: cpu_state::MSRS.len() as u32,
        pad: 0,
        entries: [KvmMsrEntry::default(); cpu_state::MSRS.len()],
    };
    for (entry, &(index, data)) in msrs.entries.iter_mut().zip(cpu_state::MSRS.iter()) {
        *entry = KvmMsrEntry {
            index,
            reserved: 0,
            data,
        };
    }
    // KVM_SET_MSRS returns how many entries it set, stopping at the first it rejects.
    let set = sys::ioctl_ref(vcpu.as_raw_fd(), KVM_SET_MSRS, &msrs)
        .map_err(context("KVM_SET_MSRS"))?
        .cast_unsigned() as usize;
    if let Some(&(index, value)) = cpu_state::MSRS.get(set) {
        return Err(io::Error::other(format!(
            "KVM_SET_MSRS rejected MSR {index:#x} = {value:#x}"
        )));
    }
    // RDPID and RDTSCP read TSC_AUX, where Linux keeps the CPU number: the guest's one CPU is
    // 0, not the host CPU the vCPU last ran on. A backend without the MSR keeps its own value.
    let tsc_aux = KvmMsrs {
        nmsrs: 1,
        pad: 0,
        entries: [KvmMsrEntry {
            index: cpu_state::MSR_TSC_AUX,
            reserved: 0,
            data: 0,
        }],
    };
    sys::ioctl_ref(vcpu.as_raw_fd(), KVM_SET_MSRS, &tsc_aux).map_err(context("KVM_SET_MSRS"))?;
    Ok(())
}

fn kvm_segment(segment: &Segment) -> KvmSegment {
    KvmSegment {
        base: segment.base,
        limit: segment.limit,
        selector: segment.selector,
        type_: segment.kind,
        present: u8::from(segment.present),
        dpl: segment.dpl,
        db: u8::from(segment.db),
        s: u8::from(segment.code_data),
        l: u8::from(segment.long),
        g: u8::from(segment.granularity),
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// The Linux syscall ABI: number in rax, arguments in rdi, rsi, rdx, r10, r8, r9.
fn syscall_exit(regs: &UserRegs) -> CpuExit {
    CpuExit::Syscall {
        nr: regs.rax,
        args: [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9],
    }
}

/// A program fault, or an error if the stubs themselves faulted (a VMM bug, not the program's).
fn fault_exit(frame: ExceptionFrame, cr2: Option<u64>) -> io::Result<CpuExit> {
    if frame.in_supervisor_code() || frame.vector >= 32 {
        return Err(io::Error::other(format!(
            "CPU exception {} (error code {:#x}) in the VMM's CPL0 code at rip {:#x}",
            frame.vector, frame.error_code, frame.rip
        )));
    }
    // The supervisor-only system area is the VMM's: to the program nothing is mapped there, as
    // below a Linux program's mappings, so a fault there reports no page present.
    let hidden = frame.vector == u64::from(PAGE_FAULT)
        && cr2.is_some_and(|a| (crate::layout::SYSTEM_AREA_START..VVAR_ADDR).contains(&a));
    Ok(CpuExit::Fault(GuestFault {
        vector: frame.vector as u8,
        error_code: if hidden {
            frame.error_code & !PF_PRESENT
        } else {
            frame.error_code
        },
        rip: frame.rip,
        address: cr2,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::descriptors::{KERNEL_CS, USER_CS};

    /// Runs everywhere: without /dev/kvm the constructor fails with the typed explanation, and
    /// before writing anything into guest memory.
    #[test]
    fn new_explains_a_missing_kvm() {
        let mem = GuestMemory::new(4 << 20).unwrap();
        if let Err(e) = KvmCpu::new(&mem, crate::layout::USER_BASE, 4 << 20) {
            if !std::path::Path::new(super::super::KVM_DEVICE).exists() {
                assert!(
                    e.get_ref()
                        .is_some_and(|inner| inner.is::<super::super::KvmUnavailable>()),
                    "{e}"
                );
                assert_eq!(e.kind(), io::ErrorKind::NotFound);
                assert_eq!(
                    mem.read_u64(crate::arch::PML4_ADDR).unwrap(),
                    0,
                    "nothing written"
                );
            }
        }
    }

    #[test]
    fn syscall_arguments_follow_the_linux_abi() {
        let regs = UserRegs {
            rax: 1,
            rdi: 2,
            rsi: 3,
            rdx: 4,
            r10: 5,
            r8: 6,
            r9: 7,
            rcx: 99,
            r11: 98,
            ..Default::default()
        };
        assert_eq!(
            syscall_exit(&regs),
            CpuExit::Syscall {
                nr: 1,
                args: [2, 3, 4, 5, 6, 7]
            }
        );
    }

    #[test]
    fn an_exception_frame_becomes_a_guest_fault() {
        let frame = ExceptionFrame::from_words([
            14,
            6,
            0x40_1000,
            u64::from(USER_CS),
            0x246,
            0x7fff_0000,
            0x2b,
        ]);
        let exit = fault_exit(frame, Some(0xdead_0000)).unwrap();
        assert_eq!(
            exit,
            CpuExit::Fault(GuestFault {
                vector: 14,
                error_code: 6,
                rip: 0x40_1000,
                address: Some(0xdead_0000)
            })
        );
    }

    #[test]
    fn a_fault_in_the_stubs_is_an_error_not_a_program_crash() {
        let frame = ExceptionFrame {
            vector: 13,
            error_code: 0,
            rip: 0x7021,
            cs: u64::from(KERNEL_CS),
            rflags: 0x2,
            rsp: 0xa000,
        };
        let err = fault_exit(frame, None).unwrap_err();
        assert!(err.to_string().contains("CPL0 code at rip 0x7021"), "{err}");
    }

    #[test]
    fn a_snapshot_xsave_area_keeps_only_the_guests_components() {
        let mut area = vec![0xAAu8; 2700];
        area[XSAVE_XSTATE_BV..XSAVE_XSTATE_BV + 8].copy_from_slice(&0xE7u64.to_le_bytes());
        area[XSAVE_XCOMP_BV..XSAVE_XCOMP_BV + 8].copy_from_slice(&(1u64 << 63).to_le_bytes());
        let bytes = xsave_for_guest(&area, 7).to_bytes();
        assert_eq!(
            bytes[XSAVE_XSTATE_BV..XSAVE_XSTATE_BV + 8],
            7u64.to_le_bytes(),
            "AVX-512 state dropped"
        );
        assert_eq!(
            bytes[XSAVE_XCOMP_BV..XSAVE_XCOMP_BV + 8],
            [0; 8],
            "standard layout"
        );
        assert_eq!(bytes[..512], area[..512], "legacy area unchanged");
        assert_eq!(bytes[2699], 0xAA);
        assert_eq!(bytes[2700..], vec![0; KvmXsave::BYTES - 2700][..], "padded");
    }

    #[test]
    fn segments_reach_kvm_unchanged() {
        let cs = kvm_segment(&cpu_state::user_segments().cs);
        assert_eq!(
            (
                cs.selector,
                cs.type_,
                cs.present,
                cs.dpl,
                cs.s,
                cs.l,
                cs.db,
                cs.g
            ),
            (USER_CS, 0xB, 1, 3, 1, 1, 0, 1)
        );
        let tr = kvm_segment(&cpu_state::user_segments().tr);
        assert_eq!(
            (tr.type_, tr.s, tr.present, tr.base),
            (0xB, 0, 1, crate::arch::TSS_ADDR)
        );
    }
}
