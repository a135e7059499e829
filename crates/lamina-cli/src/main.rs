//! `lamina`, the binary Garden spawns once per operation. It links every command but the
//! daemon, which it execs (`lamina-daemon`): see the library's docs.

fn main() -> std::process::ExitCode {
    lamina_cli::main(lamina_cli::Daemon::EXEC)
}
