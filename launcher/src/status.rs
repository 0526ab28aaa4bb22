//! Client of the server's HTTP `/status` endpoint (LMCache 0.5.6 answers 200
//! with a JSON body when the engine is up, 503 while it is not).

use std::time::Duration;

/// Per-request timeout of a `/status` poll.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What one poll of `/status` saw.
#[derive(Debug, Clone, PartialEq)]
pub enum Poll {
    /// 200 with a JSON body.
    Up(serde_json::Value),
    /// An HTTP answer other than 200 with JSON: its status code.
    NotReady(u16),
    /// No HTTP answer (refused, timed out, reset): the error text.
    NoAnswer(String),
}

/// Polls one server's `/status`.
#[derive(Debug, Clone)]
pub struct StatusClient {
    http: reqwest::Client,
    url: String,
}

impl StatusClient {
    /// A client of `url` (e.g. `http://127.0.0.1:8090/status`). Proxies from
    /// the environment are ignored: the server is on loopback.
    pub fn new(url: impl Into<String>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .no_proxy()
            .build()
            .expect("a plain HTTP client builds");
        StatusClient {
            http,
            url: url.into(),
        }
    }

    /// The polled URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// One GET of `/status`.
    pub async fn poll(&self) -> Poll {
        match self.http.get(&self.url).send().await {
            Ok(resp) if resp.status().as_u16() == 200 => match resp.json().await {
                Ok(body) => Poll::Up(body),
                Err(e) => Poll::NoAnswer(format!("unreadable body: {e}")),
            },
            Ok(resp) => Poll::NotReady(resp.status().as_u16()),
            Err(e) => Poll::NoAnswer(e.to_string()),
        }
    }
}
