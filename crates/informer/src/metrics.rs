//! What every collector of the crate's Prometheus metrics shares: a family encoded under
//! its descriptor. The collectors live beside what they measure (`informer`, `events`,
//! `sharding`); a manager registers them and serves them.

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{TypedMetric, family::Family},
};

/// Encodes `family` under the descriptor `name` / `help`.
pub(crate) fn encode_family<L, M>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    family: &Family<L, M>,
) -> Result<(), std::fmt::Error>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug,
    M: EncodeMetric + TypedMetric,
{
    let metric = encoder.encode_descriptor(name, help, None, family.metric_type())?;
    family.encode(metric)
}
