#!/usr/bin/env bash
# Runs the arch/ tables and CPL0 stubs on QEMU's x86-64 CPU model (TCG, no KVM needed): a
# manual check for machines without /dev/kvm, not part of `cargo test`.
# Needs: qemu-system-x86 (apt-get install --no-install-recommends qemu-system-x86), binutils,
# cargo. Usage: bash native-vmm/src/arch/qemu_check/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
crate=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. The system area and register values, from this crate's arch/.
mkdir -p "$work/dump/src"
cat > "$work/dump/Cargo.toml" <<TOML
[package]
name = "arch-qemu-dump"
version = "0.0.0"
edition = "2021"
[dependencies]
sandfork-vmm = { path = "$crate" }
TOML
cp "$here/dump_main.rs" "$work/dump/src/main.rs"
cargo run -q --manifest-path "$work/dump/Cargo.toml" --target-dir "$work/target" -- "$work"

# 2. The firmware and the test programs.
cp "$here/bios.s" "$work/"
(cd "$work" && as --64 -o bios.o bios.s && ld -m elf_x86_64 -e 0 -Ttext 0 -o bios.elf bios.o && objcopy -O binary bios.elf bios.bin)

halt=$(sed -n 's/^.set EXCEPTION_HALTED_RIP, 0x//p' "$work/consts.s")

# 3. One QEMU run per fault: vector, error code, CR2 (or -) expected.
expected=(
  "0 0e 0005 5000"    # read the system area
  "1 0e 0004 0"       # NULL
  "2 0d 0000 -"       # out at CPL3
  "3 03 0000 -"       # int3
  "4 0d - -"          # int 0x80 (the error code's format differs between CPU models)
  "5 06 0000 -"       # ud2
  "6 00 0000 -"       # divide error
  "7 0e 0007 8ff0"    # write the syscall frame
  "8 0e 0015 7000"    # execute the system area
  "9 0e 0004 1000000" # above guest memory
)
failures=0
for line in "${expected[@]}"; do
  read -r mode vector error cr2 <<<"$line"
  d="$work/mode$mode"
  mkdir -p "$d"
  as --64 --defsym MODE="$mode" -o "$d/user.o" "$here/user.s"
  ld -m elf_x86_64 -e 0x100000 -Ttext 0x100000 -o "$d/user.elf" "$d/user.o"
  objcopy -O binary "$d/user.elf" "$d/user.bin"
  (sleep 2; echo "info registers"; sleep 0.5; echo quit) | timeout 20 qemu-system-x86_64 \
    -machine pc -cpu max -m 16M -bios "$work/bios.bin" \
    -device loader,file="$work/sysarea.bin",addr=0x1000,force-raw=on \
    -device loader,file="$d/user.bin",addr=0x100000,force-raw=on \
    -chardev file,id=sys,path="$d/syscall.out" -device isa-debugcon,iobase=0xe0,chardev=sys \
    -chardev file,id=exc,path="$d/exception.out" -device isa-debugcon,iobase=0xe1,chardev=exc \
    -display none -serial none -parallel none -monitor stdio -d int -D "$d/int.log" >"$d/monitor.txt" 2>&1 || true
  regs=$(tr -d '\r' <"$d/monitor.txt")
  reg() { grep -o "$1=[0-9a-f]*" <<<"$regs" | head -1 | cut -d= -f2 | sed 's/^0*//;s/^$/0/'; }
  problems=()
  [[ $(cat "$d/syscall.out") == "ABCDE." ]] || problems+=("syscall console '$(cat "$d/syscall.out")'")
  [[ $(cat "$d/exception.out") == "F" ]] || problems+=("exception console '$(cat "$d/exception.out")'")
  [[ $(reg RDI) == "${vector#0}" ]] || problems+=("rdi (vector) $(reg RDI)")
  [[ $error == - || $(reg RSI) == "$(sed 's/^0*//;s/^$/0/' <<<"$error")" ]] || problems+=("rsi (error code) $(reg RSI)")
  [[ $(reg RCX) == 23 ]] || problems+=("rcx (cs) $(reg RCX)")
  [[ $(reg RIP) == "$halt" ]] || problems+=("not halted in the exception stub: rip $(reg RIP)")
  if [[ $cr2 != - ]]; then
    grep -q "v=$vector .*CR2=0*$cr2\$" "$d/int.log" || problems+=("no #PF with CR2=$cr2 in the log")
  fi
  grep -q "v=08" "$d/int.log" && problems+=("double fault")
  if ((${#problems[@]})); then
    echo "mode $mode: FAIL: ${problems[*]}"
    failures=$((failures + 1))
  else
    echo "mode $mode: ok (vector 0x$vector, rip $(reg RDX))"
  fi
done
((failures == 0)) && echo "all modes ok" || { echo "$failures mode(s) failed"; exit 1; }
