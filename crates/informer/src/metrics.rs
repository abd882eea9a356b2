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
///
/// `prometheus-client` takes each bucket's own count and sums them as it writes the `le`
/// lines, and writes `+Inf` only for a bound of `f64::MAX`; the series here hold
/// cumulative counts without it. Handed over as they are, every bucket counted those below
/// it again and the `+Inf` bucket was missing, so `histogram_quantile` answered NaN.
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
        let own_counts = own_bucket_counts(series.buckets, series.count);
        metric
            .encode_family(series.labels)?
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                series.sum,
                series.count,
                &own_counts,
                None,
            )?;
    }
    Ok(())
}

/// Each bucket's own count from cumulative `buckets`, then the `+Inf` bucket (`f64::MAX`)
/// with what passed the last bound, so the buckets add up to `count`.
fn own_bucket_counts(buckets: &[(f64, u64)], count: u64) -> Vec<(f64, u64)> {
    let mut below = 0;
    let mut own: Vec<(f64, u64)> = buckets
        .iter()
        .map(|&(bound, cumulative)| {
            let here = cumulative.saturating_sub(below);
            below = below.max(cumulative);
            (bound, here)
        })
        .collect();
    own.push((f64::MAX, count.saturating_sub(below)));
    own
}

#[cfg(test)]
mod tests {
    use prometheus_client::{collector::Collector, encoding::text::encode, registry::Registry};

    use super::*;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
    struct Labels {
        name: String,
    }

    #[derive(Debug)]
    struct OneHistogram;

    impl Collector for OneHistogram {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
            let labels = Labels { name: "a".into() };
            // 5 observations: 2 within 0.1 s, 4 within 1 s, 1 slower than every bound.
            encode_histograms(
                &mut encoder,
                "took_seconds",
                "How long",
                [HistogramSeries {
                    labels: &labels,
                    sum: 9.0,
                    count: 5,
                    buckets: &[(0.1, 2), (1.0, 4)],
                }],
            )
        }
    }

    #[test]
    fn cumulative_buckets_are_served_once_each_with_an_inf_bucket() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(OneHistogram));
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        for line in [
            r#"took_seconds_bucket{le="0.1",name="a"} 2"#,
            r#"took_seconds_bucket{le="1.0",name="a"} 4"#,
            r#"took_seconds_bucket{le="+Inf",name="a"} 5"#,
            r#"took_seconds_count{name="a"} 5"#,
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
