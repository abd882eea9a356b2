//! What this process knows of the replica it is: the names the leader elector and the
//! event recorder put on what they write.

/// The replica's Pod name: `$POD_NAME` (set it from the downward API), else the host
/// name, which is the Pod's name in a Pod, else `replica`.
pub(crate) fn pod_name() -> String {
    non_empty(std::env::var("POD_NAME").ok())
        .or_else(|| non_empty(std::env::var("HOSTNAME").ok()))
        .or_else(|| non_empty(std::fs::read_to_string("/etc/hostname").ok()))
        .unwrap_or_else(|| "replica".to_owned())
}

/// `text` trimmed, unless that leaves nothing.
pub(crate) fn non_empty(text: Option<String>) -> Option<String> {
    text.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty())
}

/// The running program's file name, the default name of its leader election Lease and
/// the `name` of its informers' metrics, made a valid one (lowercase letters, digits, `-` and `.`).
#[cfg(any(feature = "prometheus", feature = "cli"))]
pub(crate) fn program_name() -> String {
    let name = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|path| Some(path.file_stem()?.to_string_lossy().to_lowercase()))
        .unwrap_or_default();
    let name: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            _ => '-',
        })
        .collect();
    match name.trim_matches(['-', '.']) {
        "" => "operator".to_owned(),
        name => name.to_owned(),
    }
}
