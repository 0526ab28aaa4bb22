//! The two text formats a scrape can ask for, and which one an `Accept`
//! header picks (`docs/metrics.md`, "Where it listens").

/// The text formats a scrape can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (`application/openmetrics-text`), what
    /// Prometheus asks for first.
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (`text/plain`), for every other
    /// client (`curl`, `promtool check metrics`).
    Prometheus,
}

impl Format {
    /// The format the `Accept` header values `accept` ask for: OpenMetrics
    /// when one of their media ranges is `application/openmetrics-text`
    /// (any case) with a quality above 0.
    pub fn accepted<'a>(accept: impl IntoIterator<Item = &'a str>) -> Self {
        let wants_openmetrics =
            accept
                .into_iter()
                .flat_map(|value| value.split(','))
                .any(|range| {
                    let mut parts = range.split(';').map(str::trim);
                    let media = parts.next().unwrap_or("");
                    let quality = parts
                        .filter_map(|p| p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")))
                        .find_map(|q| q.parse::<f64>().ok())
                        .unwrap_or(1.0);
                    media.eq_ignore_ascii_case("application/openmetrics-text") && quality > 0.0
                });
        match wants_openmetrics {
            true => Format::OpenMetrics,
            false => Format::Prometheus,
        }
    }

    /// The `Content-Type` of this format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_follows_the_accept_media_ranges_and_their_quality() {
        let open = [
            vec!["application/openmetrics-text;version=1.0.0,text/plain;q=0.5"],
            vec!["APPLICATION/OPENMETRICS-TEXT"],
            vec!["text/plain", "application/openmetrics-text; q=0.3"],
        ];
        for accept in open {
            assert_eq!(
                Format::accepted(accept.clone()),
                Format::OpenMetrics,
                "{accept:?}"
            );
        }
        let plain = [
            vec![],
            vec!["*/*"],
            vec!["application/openmetrics-text;q=0, text/plain"],
            vec!["text/plain;version=0.0.4"],
        ];
        for accept in plain {
            assert_eq!(
                Format::accepted(accept.clone()),
                Format::Prometheus,
                "{accept:?}"
            );
        }
    }
}
