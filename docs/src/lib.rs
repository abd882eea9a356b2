//! The guides under `docs/` and the repository's README, compiled as doc tests: every Rust
//! block in them is a doc test of this package (`cargo test -p kube-informer-guides --doc`).

/// Each guide, as a doc-test-only item.
#[cfg(doctest)]
mod guides {
    #[doc = include_str!("../../README.md")]
    struct Readme;

    #[doc = include_str!("../controller.md")]
    struct Controller;

    #[doc = include_str!("../custom-resource.md")]
    struct CustomResource;

    #[doc = include_str!("../informers.md")]
    struct Informers;

    #[doc = include_str!("../sharding.md")]
    struct Sharding;

    #[doc = include_str!("../fleet.md")]
    struct Fleet;

    #[doc = include_str!("../toolkit.md")]
    struct Toolkit;

    #[doc = include_str!("../observability.md")]
    struct Observability;

    #[doc = include_str!("../warm-restarts.md")]
    struct WarmRestarts;

    #[doc = include_str!("../testing.md")]
    struct Testing;

    #[doc = include_str!("../soak.md")]
    struct Soak;

    #[doc = include_str!("../benchmarks.md")]
    struct Benchmarks;
}
