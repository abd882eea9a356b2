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

/// One series of a histogram kept outside `prometheus-client` (in atomics, or a snapshot):
/// its labels, the sum and count of what it observed, and its cumulative buckets.
pub(crate) struct HistogramSeries<'a, L> {
    pub(crate) labels: &'a L,
    pub(crate) sum: f64,
    pub(crate) count: u64,
    pub(crate) buckets: &'a [(f64, u64)],
}

/// Encodes `series` as the histogram `name` / `help`.
pub(crate) fn encode_histograms<'a, L>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = HistogramSeries<'a, L>>,
) -> Result<(), std::fmt::Error>
where
    L: EncodeLabelSet + 'a,
{
    let mut metric = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Histogram,
    )?;
    for series in series {
        metric
            .encode_family(series.labels)?
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                series.sum,
                series.count,
                series.buckets,
                None,
            )?;
    }
    Ok(())
}
