//! End-to-end tests of kube-informer and kube-testenv against a real control
//! plane; the tests themselves live in `tests/`, and what they share lives here.

mod cluster;
mod fixtures;
mod informer;
mod probe;
mod recording;
mod wait;

pub use cluster::{create_all, lease_holder, server_state, test_namespace, watch_cache_holds};
pub use fixtures::{config_map, data, labelled, name, rv};
pub use informer::{
    ErrorLog, Ev, Running, SeenError, cache_state, error_log, next_event, recorder, run,
    wait_errors,
};
pub use probe::http_get;
pub use recording::{Calls, ListCall, Recording};
pub use wait::{PATIENCE, eventually, eventually_some, eventually_some_within, within};
