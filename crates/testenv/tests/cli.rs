//! The `kube-testenv` command: it serves a working cluster, shuts down on
//! `SIGTERM`, and leaves no process behind even when killed outright.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// The CLI process, killed if a failing assertion unwinds past it.
struct Cli(Child);

impl Drop for Cli {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kube-testenv up` and returns it with the kubeconfig path it printed.
fn start_cli(extra: &[&str]) -> (Cli, PathBuf) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-testenv"))
        .arg("up")
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting kube-testenv up");
    let stdout = child.stdout.take().expect("piped stdout");
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|line| line.starts_with("KUBECONFIG="))
        .expect("kube-testenv up printed KUBECONFIG=");
    (
        Cli(child),
        PathBuf::from(line.trim_start_matches("KUBECONFIG=")),
    )
}

/// Live (non-zombie) processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("reading /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'));
        if !zombie
            && String::from_utf8_lossy(&cmdline).contains(needle)
            && pid != std::process::id()
        {
            found.push(pid);
        }
    }
    found
}

/// Waits until exactly `count` live processes mention `needle`, failing
/// after `limit`. A process just forked still shows its parent's command
/// line until it execs, so a count is a condition to await, not a snapshot.
fn await_processes(needle: &str, count: usize, limit: Duration) {
    let started = Instant::now();
    loop {
        let found = processes_mentioning(needle);
        if found.len() == count {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "expected {count} processes for {needle}, found {found:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn env_dir_of(kubeconfig: &Path) -> String {
    kubeconfig
        .parent()
        .expect("kubeconfig lives in the env dir")
        .display()
        .to_string()
}

#[test]
fn sigkill_of_the_parent_leaves_no_process_behind() {
    let (child, kubeconfig) = start_cli(&["--controller-manager"]);
    let dir = env_dir_of(&kubeconfig);
    // etcd, kube-apiserver and kube-controller-manager.
    await_processes(&dir, 3, Duration::from_secs(30));

    kill(Pid::from_raw(child.0.id() as i32), Signal::SIGKILL).expect("killing the CLI");
    await_processes(&dir, 0, Duration::from_secs(30));
}

#[test]
fn sigterm_stops_cleanly_and_kubectl_works_before() {
    let (mut child, kubeconfig) = start_cli(&[]);
    let dir = env_dir_of(&kubeconfig);
    let version = Command::new(
        kube_testenv::Binaries::ensure()
            .expect("binaries")
            .kubectl(),
    )
    .arg("--kubeconfig")
    .arg(&kubeconfig)
    .args(["version", "-o", "json"])
    .output()
    .expect("running kubectl");
    assert!(
        version.status.success(),
        "kubectl version failed: {version:?}"
    );
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(
        text.contains(&format!(
            "\"gitVersion\": \"{}\"",
            kube_testenv::KUBERNETES_VERSION
        )),
        "server reports the stamped version: {text}"
    );

    kill(Pid::from_raw(child.0.id() as i32), Signal::SIGTERM).expect("terminating the CLI");
    let status = child.0.wait().expect("waiting for the CLI");
    assert!(
        status.success(),
        "kube-testenv up exits 0 on SIGTERM: {status}"
    );
    assert!(
        processes_mentioning(&dir).is_empty(),
        "no component outlives a clean stop"
    );
    assert!(!Path::new(&dir).exists(), "the env directory is removed");
}
