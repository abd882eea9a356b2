//! The traefik-operator: the kubebuilder tutorial's operator, on kube-informer.
//!
//! Services written in any language get routed by Traefik without touching their code:
//! a controller watching Kubernetes writes them into the etcd that Traefik's KV provider
//! reads (`k8s service <-watch- operator -> etcd <- traefik`).
//!
//! * [`crd`]: the `TraefikService` custom resource and its generated CRD;
//! * [`kv`]: Traefik's keys in etcd, written transactionally; [`etcd`]: how to reach it
//!   (TLS, authentication);
//! * [`traefik_service`]: the `TraefikService` controller (finalizer, status);
//! * [`services`]: Service mode, Services opted in by annotation, no CRD;
//! * [`policy`]: which hosts, entrypoints and backends a namespace may route;
//! * [`pods`]: the tutorial's Pod controller;
//! * [`ownership`]: which operator instance and namespace own each route and host;
//! * [`sweep`]: routes left behind by objects deleted while no operator ran;
//! * [`cli`]: the flags; [`preflight`]: the install checks made at start;
//! * [`manager`]: the wiring on kube-informer's `Manager` (probes, metrics, leader
//!   election, shutdown).
//!
//! `main.rs` only parses flags and calls [`manager::run`]; tests run the same function.

pub mod cli;
pub mod crd;
pub mod etcd;
pub mod kv;
pub mod manager;
pub mod ownership;
pub mod pods;
pub mod policy;
pub mod preflight;
pub mod services;
pub mod sweep;
pub mod traefik_service;
