//! An HTTP proxy in front of a real S3 server that makes it a store that
//! refuses or lies, for the bucket bound's tests
//! (`adapters/s3-gateway/tests/hostile_store.rs`).
//!
//! It exists because no real server can be made to do these on demand:
//! answer listings whose pages never end, refuse deletions with
//! `403 AccessDenied` or `500 InternalError` (and a heap of headers the
//! gateway must not log), list sizes past any real object's, or take its
//! time over each listing page. A listing key holding a control
//! character is a real store's answer (moto and AWS S3 list it raw unless
//! asked for `encoding-type=url`): the tests store one in moto itself.
//!
//! In [`StoreFault::Pass`] every request goes to the real server and back
//! unchanged (the `Host` header included, so the server checks the
//! gateway's signatures); the faults change only the answers named.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};

/// What the proxy does to the answers from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreFault {
    /// Relay both ways unchanged.
    Pass,
    /// Answer every listing of objects itself (never forwarded): a page of
    /// [`ENDLESS_PAGE_KEYS`] LMCache keys, truncated, with a continuation
    /// token that is new at every page (`fresh_tokens`) or always the same.
    EndlessPages {
        /// Whether each page's token differs from every earlier one.
        fresh_tokens: bool,
    },
    /// Answer every DELETE itself with this status (`403 AccessDenied`,
    /// `500 InternalError`), with [`NOISY_HEADER`] among its headers.
    RefuseDeletes(u16),
    /// Relay listings with every `<Size>` replaced by
    /// [`HUGE_SIZE`].
    HugeSizes,
    /// Relay listings after this pause.
    SlowPages(Duration),
}

/// Keys of each page of [`StoreFault::EndlessPages`].
pub const ENDLESS_PAGE_KEYS: usize = 10;
/// The size [`StoreFault::HugeSizes`] lists: 9e18 bytes, three of which
/// wrap a `u64`.
pub const HUGE_SIZE: u64 = 9_000_000_000_000_000_000;
/// The request id of every refusal of [`StoreFault::RefuseDeletes`].
pub const REQUEST_ID: &str = "HOSTILE-REQUEST-ID";
/// A header name and value on every refusal of
/// [`StoreFault::RefuseDeletes`]: nothing of it may reach a log.
pub const NOISY_HEADER: (&str, &str) = ("x-hostile-store-noise", "HEADER-THAT-MUST-NOT-BE-LOGGED");

/// A running proxy on 127.0.0.1, on a runtime of its own; it stops when
/// dropped (outside any async context).
pub struct HostileStore {
    /// Its port on 127.0.0.1.
    pub port: u16,
    shared: Arc<Shared>,
    _runtime: tokio::runtime::Runtime,
}

struct Shared {
    upstream: SocketAddr,
    fault: Mutex<StoreFault>,
    client: reqwest::Client,
    pages: AtomicU64,
    deletes: AtomicU64,
}

impl HostileStore {
    /// Listens on an ephemeral port of 127.0.0.1 and relays to
    /// 127.0.0.1:`upstream`, in [`StoreFault::Pass`].
    pub fn start(upstream: u16) -> HostileStore {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the proxy's runtime");
        let listener =
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("the proxy's port");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("its address").port();
        let shared = Arc::new(Shared {
            upstream: SocketAddr::from((Ipv4Addr::LOCALHOST, upstream)),
            fault: Mutex::new(StoreFault::Pass),
            client: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("a client"),
            pages: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
        });
        let serving = shared.clone();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            serve(listener, serving).await;
        });
        HostileStore {
            port,
            shared,
            _runtime: runtime,
        }
    }

    /// Switches to `fault` for the requests that arrive from now on.
    pub fn set(&self, fault: StoreFault) {
        *self.shared.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }

    /// Listing pages (ListObjectsV2 of objects) answered so far.
    pub fn listing_pages(&self) -> u64 {
        self.shared.pages.load(Ordering::SeqCst)
    }

    /// DELETE requests received so far.
    pub fn deletes(&self) -> u64 {
        self.shared.deletes.load(Ordering::SeqCst)
    }
}

async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(shared.answer(request).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

/// Whether the query is a listing of objects (not of the reports' folder
/// or of uploads: those the faults leave alone).
fn object_listing(query: &str) -> bool {
    query.split('&').any(|p| p == "list-type=2") && !query.contains("reports")
}

impl Shared {
    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let fault = *self.fault.lock().unwrap_or_else(|e| e.into_inner());
        let query = request.uri().query().unwrap_or("").to_string();
        let listing = request.method() == hyper::Method::GET && object_listing(&query);
        if listing {
            self.pages.fetch_add(1, Ordering::SeqCst);
        }
        if request.method() == hyper::Method::DELETE {
            self.deletes.fetch_add(1, Ordering::SeqCst);
            if let StoreFault::RefuseDeletes(status) = fault {
                return refusal(status);
            }
        }
        match fault {
            StoreFault::EndlessPages { fresh_tokens } if listing => {
                self.endless_page(&query, fresh_tokens)
            }
            StoreFault::SlowPages(pause) if listing => {
                tokio::time::sleep(pause).await;
                self.relay(request, |body| body).await
            }
            StoreFault::HugeSizes if listing => self.relay(request, huge_sizes).await,
            _ => self.relay(request, |body| body).await,
        }
    }

    /// Sends `request` to the real server; `rewrite` changes its answer's
    /// body.
    async fn relay(
        &self,
        request: Request<Incoming>,
        rewrite: impl FnOnce(String) -> String,
    ) -> Response<Full<Bytes>> {
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let url = format!("http://{}{target}", self.upstream);
        let mut forwarded = self.client.request(parts.method.clone(), url).body(body);
        for (name, value) in &parts.headers {
            if !matches!(
                name.as_str(),
                "content-length" | "transfer-encoding" | "connection"
            ) {
                forwarded = forwarded.header(name, value);
            }
        }
        let Ok(answer) = forwarded.send().await else {
            return plain(502, "the real server did not answer");
        };
        let status = answer.status();
        let headers = answer.headers().clone();
        let bytes = answer.bytes().await.unwrap_or_default();
        let body = match String::from_utf8(bytes.to_vec()) {
            Ok(text) => Bytes::from(rewrite(text)),
            Err(_) => bytes,
        };
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        for (name, value) in &headers {
            if !matches!(
                name.as_str(),
                "content-length" | "transfer-encoding" | "connection"
            ) {
                response.headers_mut().insert(name, value.clone());
            }
        }
        response
    }

    /// A page of [`StoreFault::EndlessPages`].
    fn endless_page(&self, query: &str, fresh_tokens: bool) -> Response<Full<Bytes>> {
        let page = self.pages.load(Ordering::SeqCst);
        let prefix = query
            .split('&')
            .find_map(|p| p.strip_prefix("prefix="))
            .unwrap_or("")
            .replace("%2F", "/");
        let token = if fresh_tokens {
            format!("page-{page}")
        } else {
            "the-same-page".to_string()
        };
        let mut xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>b</Name><Prefix>{prefix}</Prefix><KeyCount>{ENDLESS_PAGE_KEYS}</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated><NextContinuationToken>{token}</NextContinuationToken>"
        );
        for i in 0..ENDLESS_PAGE_KEYS {
            xml.push_str(&format!(
                "<Contents><Key>{prefix}test-model@01000100@0@{page:032x}{i:032x}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>\"e\"</ETag><Size>1048576</Size><StorageClass>STANDARD</StorageClass></Contents>"
            ));
        }
        xml.push_str("</ListBucketResult>");
        let mut response = Response::new(Full::new(Bytes::from(xml)));
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/xml"),
        );
        response
    }
}

/// Every `<Size>n</Size>` of a listing as [`HUGE_SIZE`].
fn huge_sizes(xml: String) -> String {
    let mut out = String::with_capacity(xml.len());
    let mut rest = xml.as_str();
    while let Some(start) = rest.find("<Size>") {
        let Some(end) = rest[start..].find("</Size>") else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push_str(&format!("<Size>{HUGE_SIZE}</Size>"));
        rest = &rest[start + end + "</Size>".len()..];
    }
    out.push_str(rest);
    out
}

/// A refusal with S3's error body for `status`, S3's request id header
/// ([`REQUEST_ID`]) and [`NOISY_HEADER`].
fn refusal(status: u16) -> Response<Full<Bytes>> {
    let code = if status == 403 {
        "AccessDenied"
    } else {
        "InternalError"
    };
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>refused by the hostile store</Message><RequestId>{REQUEST_ID}</RequestId></Error>"
    );
    let mut response = plain(status, &xml);
    let headers = response.headers_mut();
    headers.insert(
        NOISY_HEADER.0,
        hyper::header::HeaderValue::from_static(NOISY_HEADER.1),
    );
    headers.insert(
        "x-amz-request-id",
        hyper::header::HeaderValue::from_static(REQUEST_ID),
    );
    response
}

fn plain(status: u16, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    response
}
