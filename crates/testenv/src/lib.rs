//! A real local Kubernetes control plane for tests and demos, without
//! containers.
//!
//! etcd, kube-apiserver, kube-controller-manager and kubectl are built once
//! from the published Go modules (`go/` beside this crate) and cached; a
//! [`TestEnv`] then runs them on free loopback ports with freshly generated
//! certificates, and hands out admin clients and a kubeconfig.
//!
//! A [`FaultProxy`] puts a real Toxiproxy (built the same way, from
//! `toxiproxy/`) between chosen clients and the API server, to reset, stall,
//! cut, slow or throttle their connections.
//!
//! ```no_run
//! # async fn demo() -> kube_testenv::Result<()> {
//! let env = kube_testenv::TestEnv::shared().await;
//! let namespace = env.create_namespace("my-test").await?;
//! let client = env.client().await?;
//! // ... exercise the code under test in `namespace` ...
//! env.compact_etcd().await?; // every older resourceVersion is now 410 Gone
//! # Ok(())
//! # }
//! ```

mod apiserver;
mod binaries;
mod certs;
mod controller_manager;
mod env;
mod error;
mod etcd;
mod etcd_server;
mod fault_proxy;
mod go_build;
mod http;
mod jaeger;
mod kubeconfig;
mod ports;
mod process;

pub use binaries::{
    Binaries, JAEGER_VERSION, JaegerBinary, KUBERNETES_VERSION, TOXIPROXY_VERSION, ToxiproxyBinary,
};
pub use env::{Builder, TestEnv};
pub use error::{Error, Result};
pub use etcd_server::{EtcdServer, EtcdTls};
pub use fault_proxy::{FaultProxy, ToxicStream};
pub use jaeger::Jaeger;
pub use kubeconfig::CONTEXT;
