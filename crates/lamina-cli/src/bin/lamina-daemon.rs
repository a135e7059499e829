//! `lamina-daemon`: every `lamina` command with the daemon (containerd's snapshots service,
//! background reaping and pool refills) built in. `lamina daemon …` execs it.

fn main() -> std::process::ExitCode {
    lamina_cli::main(lamina_cli::daemon_in_process())
}
