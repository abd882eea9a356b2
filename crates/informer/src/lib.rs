//! Client-go's informer machinery for Rust, on the kube-rs client.

pub mod workqueue;
