//! `fleet-propagator`: one controller over a fleet of clusters, on kube-informer's
//! [`fleet`](kube_informer::fleet).
//!
//! A platform team keeps configuration on a hub cluster and needs it in every member
//! cluster: a `PropagatedConfig` on the hub holds a ConfigMap's data and the members it
//! goes to; each member gets a ConfigMap of the same namespace and name; the object's
//! status says, per member, whether its copy is current; a copy that fails is an Event on
//! the hub object; deleting the object removes every copy first (a finalizer per member).
//! Members are kubeconfig Secrets in a namespace of the hub
//! ([`KubeconfigSecrets`](kube_informer::fleet::KubeconfigSecrets)): adding one engages
//! it, rotating its credentials restarts it, deleting it stops it.
//!
//! * [`crd`]: the `PropagatedConfig` resource;
//! * [`propagate`]: what runs for each member;
//! * [`release`]: the finalizers of members gone from the fleet, released;
//! * [`run`]: the wiring: the CRD installed, the hub informer, the fleet.

pub mod crd;
pub mod propagate;
pub mod release;
pub mod run;
