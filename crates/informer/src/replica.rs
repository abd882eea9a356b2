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
