//! client-go's REST client metrics, under its names and labels, for every request a
//! client built here ([`client`](super::client), [`ClusterSource`](super::ClusterSource))
//! sends: `rest_client_requests_total{code, host, method}` and the histogram
//! `rest_client_request_duration_seconds{host, verb}` (up to the response's headers, so a
//! watch counts its start, as client-go's does). They are kept for the whole process, as
//! client-go keeps its own, and served by a [`Manager`](crate::Manager).

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Mutex, OnceLock, PoisonError},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tower::{Layer, Service};

/// client-go's bucket bounds for `rest_client_request_duration_seconds` (seconds).
pub(crate) const DURATION_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// The requests sent so far, by status code (`<error>` when none came), host and method.
pub(crate) type RequestCounts = HashMap<(String, String, String), u64>;

/// Request durations by host and verb: the count, sum, and count per bucket (not
/// cumulative).
#[derive(Clone, Debug, Default)]
pub(crate) struct Durations {
    pub(crate) count: u64,
    pub(crate) sum: Duration,
    pub(crate) buckets: [u64; DURATION_BUCKETS.len()],
}

impl Durations {
    /// Each bucket's bound and the requests within it, cumulative.
    #[cfg(feature = "prometheus")]
    fn cumulative_buckets(&self) -> Vec<(f64, u64)> {
        let mut cumulative = 0;
        DURATION_BUCKETS
            .iter()
            .zip(self.buckets)
            .map(|(bound, n)| {
                cumulative += n;
                (*bound, cumulative)
            })
            .collect()
    }
}

#[derive(Default)]
struct Recorded {
    requests: RequestCounts,
    durations: HashMap<(String, String), Durations>,
}

fn recorded() -> &'static Mutex<Recorded> {
    static RECORDED: OnceLock<Mutex<Recorded>> = OnceLock::new();
    RECORDED.get_or_init(Mutex::default)
}

fn record(host: String, method: String, code: String, took: Duration) {
    let mut recorded = recorded().lock().unwrap_or_else(PoisonError::into_inner);
    *recorded
        .requests
        .entry((code, host.clone(), method.clone()))
        .or_default() += 1;
    let durations = recorded.durations.entry((host, method)).or_default();
    durations.count += 1;
    durations.sum += took;
    let seconds = took.as_secs_f64();
    if let Some(bucket) = DURATION_BUCKETS.iter().position(|b| seconds <= *b) {
        durations.buckets[bucket] += 1;
    }
}

/// What was recorded so far: the counts, and the durations by `(host, verb)`.
#[cfg(any(test, feature = "prometheus"))]
pub(crate) fn snapshot() -> (RequestCounts, HashMap<(String, String), Durations>) {
    let recorded = recorded().lock().unwrap_or_else(PoisonError::into_inner);
    (recorded.requests.clone(), recorded.durations.clone())
}

/// Records each request the wrapped service sends.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RecordRequests;

impl<S> Layer<S> for RecordRequests {
    type Service = Recording<S>;

    fn layer(&self, inner: S) -> Recording<S> {
        Recording { inner }
    }
}

/// A service whose requests are recorded.
#[derive(Clone, Debug)]
pub(crate) struct Recording<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Recording<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let host = request
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default();
        let method = request.method().as_str().to_owned();
        #[cfg(feature = "opentelemetry")]
        let span = crate::telemetry::spans::request(&method, request.uri().path());
        let started = Instant::now();
        let response = {
            #[cfg(feature = "opentelemetry")]
            let _entered = span.enter();
            self.inner.call(request)
        };
        let recorded = async move {
            let response = response.await;
            let code = match &response {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            #[cfg(feature = "opentelemetry")]
            tracing::Span::current().record("http.response.status_code", code.as_str());
            record(host, method, code, started.elapsed());
            response
        };
        #[cfg(feature = "opentelemetry")]
        let recorded = tracing::Instrument::instrument(recorded, span);
        Box::pin(recorded)
    }
}

/// The recorded requests on Prometheus, read at each scrape.
#[cfg(feature = "prometheus")]
#[derive(Debug)]
struct RestClientCollector;

#[cfg(feature = "prometheus")]
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct RequestLabels {
    code: String,
    host: String,
    method: String,
}

#[cfg(feature = "prometheus")]
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct DurationLabels {
    host: String,
    verb: String,
}

#[cfg(feature = "prometheus")]
impl prometheus_client::collector::Collector for RestClientCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::{counter::Counter, family::Family};

        let (requests, durations) = snapshot();
        let counts: Family<RequestLabels, Counter> = Family::default();
        for ((code, host, method), n) in requests {
            counts
                .get_or_create(&RequestLabels { code, host, method })
                .inc_by(n);
        }
        crate::metrics::encode_family(
            &mut encoder,
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host",
            &counts,
        )?;
        let series: Vec<(DurationLabels, Durations)> = durations
            .into_iter()
            .map(|((host, verb), timed)| (DurationLabels { host, verb }, timed))
            .collect();
        let buckets: Vec<Vec<(f64, u64)>> = series
            .iter()
            .map(|(_, timed)| timed.cumulative_buckets())
            .collect();
        crate::metrics::encode_histograms(
            &mut encoder,
            "rest_client_request_duration_seconds",
            "Request latency in seconds, up to the response's headers. Broken down by verb and host",
            series
                .iter()
                .zip(&buckets)
                .map(
                    |((labels, timed), buckets)| crate::metrics::HistogramSeries {
                        labels,
                        sum: timed.sum.as_secs_f64(),
                        count: timed.count,
                        buckets,
                    },
                ),
        )
    }
}

/// Serves the process's REST client metrics from `registry`.
#[cfg(feature = "prometheus")]
pub(crate) fn register_rest_client_metrics(registry: &mut prometheus_client::registry::Registry) {
    registry.register_collector(Box::new(RestClientCollector));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_request_is_counted_by_code_host_and_method_and_timed() {
        let service = tower::service_fn(|request: http::Request<()>| async move {
            let status = if request.uri().path() == "/missing" {
                404
            } else {
                200
            };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(status).body(()).unwrap(),
            )
        });
        let mut service = RecordRequests.layer(service);
        for path in ["/ok", "/missing", "/ok"] {
            let request = http::Request::get(format!("https://metrics-test.example:6443{path}"))
                .body(())
                .unwrap();
            tower::ServiceExt::ready(&mut service).await.unwrap();
            service.call(request).await.unwrap();
        }
        let (requests, durations) = snapshot();
        let host = "metrics-test.example:6443".to_owned();
        let count = |code: &str| requests.get(&(code.to_owned(), host.clone(), "GET".to_owned()));
        assert_eq!(count("200"), Some(&2));
        assert_eq!(count("404"), Some(&1));
        let timed = &durations[&(host, "GET".to_owned())];
        assert_eq!(timed.count, 3);
        assert_eq!(timed.buckets[0], 3, "each took under 5 ms");
    }
}
