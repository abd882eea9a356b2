//! Errors of the informer machinery.
//! The full documentation is on [`Error`].

use std::{fmt, time::Duration};

use kube_core::Status;

/// How a server that does not stream lists answered a streaming list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamingRefusal {
    /// It refused `sendInitialEvents` (400 or 422): the feature is off.
    Rejected,
    /// It sent an ordinary watch: it does not know the parameter.
    Ignored,
}

/// A boxed error from below (HTTP stack, JSON decoder, ...).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The API verb a list/watch error belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// A (paged) list call.
    List,
    /// A watch call, or an event read from a watch stream.
    Watch,
}

impl Verb {
    /// The verb as Kubernetes RBAC spells it (`list`, `watch`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::List => "list",
            Verb::Watch => "watch",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can go wrong in this crate's informer machinery.
///
/// Errors of the informer machinery.
///
/// One enum, [`Error`], covers everything a list, a watch, the store or a cache-sync wait can
/// report. The reflector sorts list/watch failures into a few kinds because each kind calls for
/// a different recovery:
///
/// | kind | recovery |
/// |---|---|
/// | [`Error::Gone`] (HTTP 410, "too old resource version") | relist from resourceVersion `""` |
/// | [`Error::Decode`], [`Error::MalformedEvent`] | relist (an event was lost) |
/// | [`Error::Forbidden`], [`Error::Api`], [`Error::Transport`], [`Error::ContinueLoop`] | back off, then retry |
/// | [`Error::IdleTimeout`] | reconnect the watch at once |
/// | [`Error::StreamingListUnsupported`] | switch from streaming lists to paged lists |
///
/// Every such error is also handed to the watch-error hook, if one is registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// HTTP 410 Gone: the requested resourceVersion (or a list's continue token) is older than
    /// what the API server still keeps. Also produced for an `ERROR` watch event that says
    /// "too old resource version". The reflector relists from resourceVersion `""`.
    #[error("{verb} {resource}: resource version expired (410 Gone): {message}")]
    Gone {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// Which call failed.
        verb: Verb,
        /// The server's message.
        message: String,
    },

    /// HTTP 403 Forbidden: RBAC does not allow this verb on this resource.
    #[error(
        "forbidden: cannot {verb} {resource} {}: {message}",
        namespace.as_deref().map_or_else(|| "at cluster scope".to_owned(), |ns| format!("in namespace {ns:?}"))
    )]
    Forbidden {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// The verb that was refused.
        verb: Verb,
        /// The namespace of the request; `None` for a cluster-wide request.
        namespace: Option<String>,
        /// The server's message.
        message: String,
    },

    /// One object or watch event could not be decoded into the Rust type.
    #[error("{verb} {resource}: cannot decode response: {source}")]
    Decode {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// Which call's response failed to decode.
        verb: Verb,
        /// The decoder's error.
        #[source]
        source: BoxError,
    },

    /// A watch event decoded but makes no sense (an object without a name, for instance).
    #[error("watch {resource}: malformed event: {detail}")]
    MalformedEvent {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// What is wrong with it.
        detail: String,
    },

    /// A paged list's server sent a `continue` token it had sent before in the same list:
    /// following it would fetch the same pages for ever. The reflector backs off and lists
    /// again from the first page.
    #[error(
        "list {resource}: continue token {token} came back after {pages} pages; the list would never end"
    )]
    ContinueLoop {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// The token, quoted, its middle left out when it is long.
        token: String,
        /// The pages read before it came back.
        pages: usize,
    },

    /// Any other error status from the API server (429, 500, 503, ...).
    #[error("{verb} {resource}: API error {}: {} ({})", status.code, status.message, status.reason)]
    Api {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// Which call failed.
        verb: Verb,
        /// The status the server sent.
        status: Box<Status>,
    },

    /// The request never got an answer: connection refused or reset, TLS, timeouts, ...
    #[error("{verb} {resource}: transport error: {source}")]
    Transport {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// Which call failed.
        verb: Verb,
        /// The underlying error.
        #[source]
        source: BoxError,
    },

    /// A watch sent nothing (not even a bookmark) for the configured idle timeout: the
    /// connection is presumed dead (a load balancer dropped it) and is replaced.
    #[error("watch {resource}: no event or bookmark for {idle:?}; reconnecting")]
    IdleTimeout {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// How long the watch was silent.
        idle: Duration,
    },

    /// The API server does not stream lists (`sendInitialEvents`): it rejected the parameter,
    /// or ignored it and sent an ordinary watch. The reflector falls back to a paged list:
    /// for this sync when the server rejected it (its `WatchList` feature may be turned on
    /// later), for good when it ignored it (a server older than the parameter).
    #[error("watch {resource}: the API server does not stream lists: {detail}")]
    StreamingListUnsupported {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// How the server answered.
        refusal: StreamingRefusal,
        /// How it showed.
        detail: String,
    },

    /// The API client could not be built from its configuration (TLS, authentication).
    #[error("cannot build the API client: {0}")]
    Client(#[source] BoxError),

    /// No cluster configuration could be loaded: a kubeconfig that cannot be read or has
    /// no such context, or none found at all.
    #[error("cannot load the cluster configuration: {0}")]
    Config(#[source] BoxError),

    /// An object has no `metadata.name`, so it has no key.
    #[error("object has no metadata.name")]
    MissingName,

    /// No index with this name is registered on the store.
    #[error("index {0:?} does not exist")]
    IndexNotFound(String),

    /// An index with this name is already registered on the store.
    #[error("index {0:?} already exists")]
    IndexExists(String),

    /// [`wait_for_cache_sync`](crate::wait_for_cache_sync) gave up.
    #[error("caches did not sync within {0:?}")]
    SyncTimeout(Duration),

    /// A new shard was given to an informer built without one (it lists whole, in the
    /// list mode it was built with).
    #[error("the informer was built without a shard")]
    NotSharded,

    /// A snapshot was asked of an informer built without a warm restart.
    #[error("the informer was built without a warm restart")]
    NoWarmRestart,

    /// A warm restart's snapshot could not be written.
    #[error("writing the snapshot {}: {source}", path.display())]
    Snapshot {
        /// Where it was to be written.
        path: std::path::PathBuf,
        /// Why it was not.
        #[source]
        source: std::io::Error,
    },

    /// A divergence check was asked of an informer built without one.
    #[error("the informer was built without a divergence check")]
    NoDivergenceCheck,

    /// A handler was added to an informer that has stopped: it would never run.
    #[error("the informer has stopped; a handler added now would never run")]
    InformerStopped,

    /// The server has not caught up with the requested resourceVersion (504 with cause
    /// `ResourceVersionTooLarge`, "Too large resource version"): behind a lagging API server
    /// of an HA control plane, or after etcd was restored from a backup. The reflector
    /// relists from resourceVersion `""`, as client-go does.
    #[error("{verb} {resource}: resource version too large for the server: {message}")]
    ResourceVersionTooLarge {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// Which call failed.
        verb: Verb,
        /// The server's message.
        message: String,
    },

    /// One object does not decode as the informer's type; its key did. The reflector keeps
    /// its last good state and goes on with every other object.
    #[error(
        "{verb} {resource}: object {key} does not decode, its last good state is kept: {reason}"
    )]
    UndecodableObject {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// Which call delivered it.
        verb: Verb,
        /// The object's key (`namespace/name`).
        key: String,
        /// Why it does not decode.
        reason: String,
    },

    /// A stored object does not read as the type asked of
    /// [`Store::get_as`](crate::Store::get_as): the type declares a field the object has in
    /// another shape, or a required field the object lacks.
    #[error("object {key} does not read as {target}: {source}")]
    Projection {
        /// The object's key (`namespace/name`).
        key: String,
        /// The type it was read as.
        target: &'static str,
        /// The decoder's error.
        #[source]
        source: BoxError,
    },

    /// Code run while listing or watching panicked: a transform, an index function, a
    /// codec, or a decoder. The reflector reports it and relists, so the cache is rebuilt
    /// from the server rather than left half-written.
    #[error("{resource}: a panic while applying the list or watch: {message}")]
    Panicked {
        /// The resource, as `plural[.group]`.
        resource: String,
        /// The panic's message.
        message: String,
    },
}

impl Error {
    /// Sorts a `kube_client` error from a list or watch call on `resource` (in `namespace`).
    pub fn from_kube(
        err: kube_client::Error,
        verb: Verb,
        resource: &str,
        namespace: Option<&str>,
    ) -> Self {
        match err {
            // kube-client falls back to parsing an undecodable watch line as a `Status`; every
            // JSON object parses as one (all fields default), so a status without a code is
            // really an object that did not decode.
            kube_client::Error::Api(status) if status.code == 0 && status.reason.is_empty() => {
                Error::Decode {
                    resource: resource.to_owned(),
                    verb,
                    source: "event is neither a valid object of this kind nor an API status".into(),
                }
            }
            kube_client::Error::Api(status) => Self::from_status(status, verb, resource, namespace),
            kube_client::Error::SerdeError(e) => Error::Decode {
                resource: resource.to_owned(),
                verb,
                source: Box::new(e),
            },
            other => Error::Transport {
                resource: resource.to_owned(),
                verb,
                source: Box::new(other),
            },
        }
    }

    /// Sorts an API `Status` (an error response, or the object of an `ERROR` watch event).
    pub fn from_status(
        status: Box<Status>,
        verb: Verb,
        resource: &str,
        namespace: Option<&str>,
    ) -> Self {
        let resource = resource.to_owned();
        if is_too_large_status(&status) {
            return Error::ResourceVersionTooLarge {
                resource,
                verb,
                message: status.message,
            };
        }
        if is_gone_status(&status) {
            return Error::Gone {
                resource,
                verb,
                message: status.message,
            };
        }
        if status.code == 403 || status.reason == "Forbidden" {
            return Error::Forbidden {
                resource,
                verb,
                namespace: namespace.map(str::to_owned),
                message: status.message,
            };
        }
        Error::Api {
            resource,
            verb,
            status,
        }
    }

    /// True for a 410 Gone / "too old resource version": the caller must relist.
    pub fn is_gone(&self) -> bool {
        matches!(self, Error::Gone { .. })
    }

    /// True for a 503 Service Unavailable: a server starting, or one that cannot reach its
    /// storage, which will serve the same request once it can.
    pub fn is_service_unavailable(&self) -> bool {
        matches!(self, Error::Api { status, .. } if status.code == 503)
    }

    /// True for an answer that asks to try again soon: 503 Service Unavailable, or 429 Too
    /// Many Requests (a server whose storage is still (re)initializing after a restart,
    /// or one shedding load). client-go's client retries both after the server's
    /// `Retry-After`, about a second.
    pub fn is_retry_soon(&self) -> bool {
        matches!(self, Error::Api { status, .. } if matches!(status.code, 429 | 503))
    }

    /// True when the server has not caught up with the requested resourceVersion: the
    /// caller must relist from `""`.
    pub fn is_resource_version_too_large(&self) -> bool {
        matches!(self, Error::ResourceVersionTooLarge { .. })
    }

    /// True for a 404 Not Found answered to a list or watch: the server does not serve the
    /// resource (a CRD deleted, or not installed yet; an API group turned off). A list of a
    /// namespace that does not exist is no such error: it is empty.
    pub fn is_resource_missing(&self) -> bool {
        matches!(self, Error::Api { status, .. } if status.code == 404)
    }

    /// True for a 403 Forbidden.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, Error::Forbidden { .. })
    }

    /// A copy of this error when retrying the same request cannot fix it: 403 Forbidden (RBAC),
    /// 401 Unauthorized (credentials), 404 Not Found (the resource type is not served, e.g. a
    /// CRD that is not installed). `None` for every other error.
    ///
    /// The reflector retries these like any other error, since permissions and CRDs can be
    /// added while it runs; callers that cannot wait, such as a controller's first sync,
    /// use this to fail with a clear reason instead of waiting forever.
    pub fn permanent_copy(&self) -> Option<Error> {
        match self {
            Error::Forbidden {
                resource,
                verb,
                namespace,
                message,
            } => Some(Error::Forbidden {
                resource: resource.clone(),
                verb: *verb,
                namespace: namespace.clone(),
                message: message.clone(),
            }),
            Error::Api {
                resource,
                verb,
                status,
            } if matches!(status.code, 401 | 404) => Some(Error::Api {
                resource: resource.clone(),
                verb: *verb,
                status: status.clone(),
            }),
            _ => None,
        }
    }

    /// True when the reflector answers this error with a relist (as opposed to a plain retry
    /// of the same call): gone resource versions, undecodable or malformed events.
    pub fn needs_relist(&self) -> bool {
        matches!(
            self,
            Error::Gone { .. }
                | Error::ResourceVersionTooLarge { .. }
                | Error::Decode { .. }
                | Error::MalformedEvent { .. }
                | Error::Panicked { .. }
        )
    }
}

/// An error and every error it came from, `: `-separated, for logs: a cause the text
/// already says is left out, and an API server's answer is its message, not the client's
/// dump of the whole `Status`.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = match (as_a::<kube_client::Error>(cause), as_a::<Status>(cause)) {
            (Some(client), _) => server_says(client),
            (None, Some(status)) => status_says(status),
            (None, None) => cause.to_string(),
        };
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

/// `error` as a `T`, boxed or not (a boxed source is a `Box<T>` to `downcast_ref`).
fn as_a<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    error
        .downcast_ref::<T>()
        .or_else(|| error.downcast_ref::<Box<T>>().map(|boxed| &**boxed))
}

/// What a client error says, with an API server's answer as its message alone (the
/// client's own text repeats the whole `Status`).
pub(crate) fn server_says(error: &kube_client::Error) -> String {
    match error {
        kube_client::Error::Api(status) => status_says(status),
        other => other.to_string(),
    }
}

/// An API server's answer as a reader wants it: its message, or its reason and code when
/// it gave none.
fn status_says(status: &Status) -> String {
    match (status.message.is_empty(), status.reason.is_empty()) {
        (false, _) => status.message.clone(),
        (true, false) => format!("{} ({})", status.reason, status.code),
        (true, true) => format!("status {}", status.code),
    }
}

/// `text` quoted for a message, its middle left out when it is long: what a server sends
/// (a token, a version) may be of any length, and a log line should not be.
pub(crate) fn quoted_short(text: &str) -> String {
    const HEAD: usize = 40;
    const TAIL: usize = 16;
    let chars = text.chars().count();
    if chars <= HEAD + TAIL {
        return format!("{text:?}");
    }
    let head: String = text.chars().take(HEAD).collect();
    let tail: String = text.chars().skip(chars - TAIL).collect();
    format!(
        "\"{}…{}\" ({} bytes)",
        head.escape_debug(),
        tail.escape_debug(),
        text.len()
    )
}

/// What a caught panic said, when it said it in text.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string panic payload")
}

/// client-go's `isTooLargeResourceVersionError`: a timeout (504) whose cause is
/// `ResourceVersionTooLarge`, or the message older servers send without the cause.
fn is_too_large_status(status: &Status) -> bool {
    let has_cause = status.details.as_ref().is_some_and(|details| {
        details
            .causes
            .iter()
            .any(|cause| cause.reason == "ResourceVersionTooLarge")
    });
    (status.code == 504 || status.reason == "Timeout") && has_cause
        || status.message.contains("Too large resource version")
}

/// 410 by code or reason, or the etcd/apiserver "too old resource version" wording that
/// some servers send with another code (500) in a watch `ERROR` event.
fn is_gone_status(status: &Status) -> bool {
    status.code == 410
        || status.reason == "Expired"
        || status.reason == "Gone"
        || status.message.contains("too old resource version")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str, message: &str) -> Box<Status> {
        Box::new(Status {
            status: None,
            code,
            message: message.into(),
            metadata: None,
            reason: reason.into(),
            details: None,
        })
    }

    #[test]
    fn a_chain_gives_the_server_s_message_once_not_the_client_s_status_dump() {
        let conflict = kube_client::Error::Api(status(
            409,
            "Conflict",
            "Operation cannot be fulfilled on configmaps \"a\": the object has been modified",
        ));
        let error = crate::ClientError::Api {
            verb: "patch",
            kind: "ConfigMap".into(),
            key: "ns/a".into(),
            source: Box::new(conflict),
        };
        let said = "patch ConfigMap ns/a: Operation cannot be fulfilled on configmaps \"a\": \
                    the object has been modified";
        assert_eq!(error.to_string(), said);
        assert_eq!(
            error_chain(&error),
            said,
            "nothing said twice, no Status dump"
        );

        let silent = kube_client::Error::Api(status(503, "ServiceUnavailable", ""));
        assert_eq!(server_says(&silent), "ServiceUnavailable (503)");
        let wrapped = std::io::Error::other(silent);
        assert_eq!(
            error_chain(&wrapped),
            format!("{}: ServiceUnavailable (503)", wrapped),
            "an outside error's text is kept as it is"
        );
    }

    #[test]
    fn long_texts_from_a_server_are_shortened_in_messages() {
        assert_eq!(quoted_short("t1"), "\"t1\"");
        let long = format!("{}é{}", "a".repeat(100_000), "z".repeat(15));
        let short = quoted_short(&long);
        assert!(
            short.starts_with(&format!("\"{}…", "a".repeat(40))),
            "{short}"
        );
        assert!(
            short.ends_with(&format!("é{}\" (100017 bytes)", "z".repeat(15))),
            "{short}"
        );
        assert!(short.len() < 100, "{short}");
    }

    #[test]
    fn gone_by_code_reason_or_message() {
        for st in [
            status(410, "", "x"),
            status(0, "Expired", "x"),
            status(500, "InternalError", "too old resource version: 5 (10)"),
        ] {
            let e = Error::from_status(st, Verb::Watch, "pods", None);
            assert!(e.is_gone(), "{e}");
            assert!(e.needs_relist());
        }
    }

    #[test]
    fn too_large_resource_version_by_cause_or_message() {
        let mut by_cause = status(504, "Timeout", "Timeout: the server has not caught up");
        by_cause.details = Some(kube_core::response::StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: vec![kube_core::response::StatusCause {
                reason: "ResourceVersionTooLarge".into(),
                message: "Too large resource version".into(),
                field: String::new(),
            }],
            retry_after_seconds: 0,
        });
        for st in [
            by_cause,
            status(
                504,
                "Timeout",
                "Too large resource version: 90, current: 80",
            ),
        ] {
            let e = Error::from_status(st, Verb::List, "pods", None);
            assert!(e.is_resource_version_too_large(), "{e}");
            assert!(e.needs_relist());
        }
        // A 504 for another reason is an ordinary error.
        let e = Error::from_status(status(504, "Timeout", "slow"), Verb::List, "pods", None);
        assert!(
            !e.is_resource_version_too_large() && !e.needs_relist(),
            "{e}"
        );
    }

    #[test]
    fn forbidden_names_resource_verb_and_namespace() {
        let e = Error::from_status(
            status(403, "Forbidden", "no"),
            Verb::List,
            "widgets.example.com",
            Some("team-a"),
        );
        assert!(e.is_forbidden());
        let msg = e.to_string();
        assert!(msg.contains("list"), "{msg}");
        assert!(msg.contains("widgets.example.com"), "{msg}");
        assert!(msg.contains("\"team-a\""), "{msg}");
        let cluster = Error::from_status(status(403, "", "no"), Verb::Watch, "nodes", None);
        assert!(cluster.to_string().contains("at cluster scope"));
    }

    #[test]
    fn kube_errors_are_sorted() {
        let serde = serde_json::from_str::<u32>("x").unwrap_err();
        let e = Error::from_kube(
            kube_client::Error::SerdeError(serde),
            Verb::Watch,
            "configmaps",
            None,
        );
        assert!(matches!(e, Error::Decode { .. }));
        assert!(e.to_string().contains("configmaps"));
        let io = std::io::Error::other("reset");
        let e = Error::from_kube(
            kube_client::Error::ReadEvents(io),
            Verb::Watch,
            "pods",
            None,
        );
        assert!(matches!(e, Error::Transport { .. }));
        assert!(!e.needs_relist());
        let e = Error::from_kube(
            kube_client::Error::Api(status(500, "InternalError", "boom")),
            Verb::List,
            "pods",
            None,
        );
        assert!(matches!(e, Error::Api { .. }));
    }
}
