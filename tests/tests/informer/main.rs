//! The informer against a real control plane: paged lists, handler events, indexes, a 410
//! after etcd compaction, an apiserver restart, a blocked handler, typed / dynamic /
//! metadata-only informers, RBAC and decode errors, divergence checks, network faults
//! through Toxiproxy. Also the exact requests the `Api`
//! list-watch sends, read back from the apiserver's audit log.
//!
//! One test binary, so its tests share one control plane ([`kube_testenv::TestEnv::shared`]);
//! the helpers they have in common are in the `tests` library.

mod divergence;
mod errors;
mod events;
mod faults;
mod indexes;
mod kinds;
mod lists;
mod network;
mod watch;
