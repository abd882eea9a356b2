//! Benchmarks of kube-informer; see `benches/`.
