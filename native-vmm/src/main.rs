//! `sandfork-vmm` command line.

fn main() {
    eprintln!("sandfork-vmm: no command yet");
    std::process::exit(2);
}
