//! What the in-memory tests share: the fake of ConfigMaps, objects for it, and waits that
//! fail with a message instead of hanging. Each test binary uses part of it.
#![allow(dead_code)]

use std::{future::Future, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube_informer::testing::FakeListWatch;

/// The in-memory `ListWatch` the tests drive.
pub type Fake = FakeListWatch<ConfigMap>;

/// Far longer than anything here takes in paused time; reaching it means a frozen cache or
/// a lost event.
pub const PATIENCE: Duration = Duration::from_secs(3600);

/// A ConfigMap `ns/name`.
pub fn cm(name: &str) -> ConfigMap {
    Fake::object(Some("ns"), name)
}

/// A ConfigMap `namespace/name` labelled `app=<app>`.
pub fn labelled_in(namespace: &str, name: &str, app: &str) -> ConfigMap {
    let mut cm = Fake::object(Some(namespace), name);
    cm.metadata.labels = Some([("app".to_owned(), app.to_owned())].into());
    cm
}

/// A fake holding a ConfigMap `namespace/<name>` for each of `names`.
pub fn fake_with(namespace: &str, names: &[&str]) -> Fake {
    let fake = Fake::new("configmaps");
    for name in names {
        fake.add(Fake::object(Some(namespace), name));
    }
    fake
}

/// `fut`'s output, or a panic naming `what` after [`PATIENCE`].
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {PATIENCE:?}"))
}

/// Waits until `condition` holds, checking after each tick of paused time.
pub async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    within(what, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}
