//! A plain S3 client for tests that look into a bucket from outside the
//! node, as an operator would: create the bucket, list a prefix, put and
//! get objects. It talks path-style over http to any S3 server on loopback
//! (s3s-fs, moto, OpenStack Swift's `s3api`, SeaweedFS) through
//! `aws-sdk-s3`, signed with the store's real key, so what it sees is what
//! the store holds, not what a gateway reports.

use std::time::SystemTime;

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The whole key (with the prefix it was listed under).
    pub key: String,
    /// Bytes.
    pub bytes: u64,
    /// The store's `LastModified`.
    pub modified: SystemTime,
}

/// Where a bucket lives and the key that may use it.
#[derive(Debug, Clone)]
pub struct StoreAccess {
    /// `127.0.0.1:<port>` of an S3 server speaking plain http.
    pub endpoint: String,
    /// The region its SigV4 signatures name (`us-east-1` for s3s-fs and
    /// SeaweedFS, Swift's `s3api` `location`).
    pub region: String,
    /// Access key id.
    pub key_id: String,
    /// Secret access key.
    pub secret: String,
}

/// A blocking client for one bucket, on a runtime of its own (so usable
/// from any thread of a test, also a sampler's).
pub struct BucketClient {
    client: aws_sdk_s3::Client,
    bucket: String,
    runtime: tokio::runtime::Runtime,
}

impl BucketClient {
    /// The client of `bucket` at `store`.
    pub fn new(store: &StoreAccess, bucket: &str) -> BucketClient {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the bucket client's runtime");
        let credentials = Credentials::new(&store.key_id, &store.secret, None, None, "e2e");
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(store.region.clone()))
            .endpoint_url(format!("http://{}", store.endpoint))
            .force_path_style(true)
            .credentials_provider(credentials)
            .http_client(aws_smithy_http_client::Builder::new().build_http())
            .build();
        BucketClient {
            client: aws_sdk_s3::Client::from_conf(config),
            bucket: bucket.to_string(),
            runtime,
        }
    }

    /// Every object whose key starts with `prefix` (ListObjectsV2, paged);
    /// `Err` with the SDK's error when a page fails.
    pub fn list(&self, prefix: &str) -> Result<Vec<Listed>, String> {
        self.runtime.block_on(async {
            let mut pages = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .into_paginator()
                .send();
            let mut found = Vec::new();
            while let Some(page) = pages.next().await {
                let page =
                    page.map_err(|e| aws_sdk_s3::error::DisplayErrorContext(e).to_string())?;
                for object in page.contents() {
                    let (Some(key), Some(size), Some(modified)) =
                        (object.key(), object.size(), object.last_modified())
                    else {
                        continue;
                    };
                    found.push(Listed {
                        key: key.to_string(),
                        bytes: size.max(0) as u64,
                        modified: SystemTime::try_from(*modified).unwrap_or(SystemTime::UNIX_EPOCH),
                    });
                }
            }
            Ok(found)
        })
    }

    /// Creates the bucket (`PUT /<bucket>`, no location constraint);
    /// panics when the store refuses.
    pub fn create_bucket(&self) {
        self.runtime
            .block_on(self.client.create_bucket().bucket(&self.bucket).send())
            .unwrap_or_else(refused(format!("create bucket {}", self.bucket)));
    }

    /// Writes `bytes` at `key`; panics when the store refuses.
    pub fn put(&self, key: &str, bytes: &[u8]) {
        self.runtime
            .block_on(
                self.client
                    .put_object()
                    .bucket(&self.bucket)
                    .key(key)
                    .body(ByteStream::from(bytes.to_vec()))
                    .send(),
            )
            .unwrap_or_else(refused(format!("PUT {key}")));
    }

    /// The content of `key`; panics when it cannot be read.
    pub fn get(&self, key: &str) -> Vec<u8> {
        self.runtime.block_on(async {
            let answer = self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(key)
                .send()
                .await
                .unwrap_or_else(refused(format!("GET {key}")));
            answer
                .body
                .collect()
                .await
                .unwrap_or_else(|e| panic!("GET {key}: the body: {e}"))
                .to_vec()
        })
    }

    /// Starts a multipart upload of `key` and uploads `part` as its part 1,
    /// leaving it unfinished; returns its upload id. Panics when the store
    /// refuses.
    pub fn start_upload(&self, key: &str, part: &[u8]) -> String {
        self.runtime.block_on(async {
            let created = self
                .client
                .create_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .send()
                .await
                .unwrap_or_else(refused(format!("start an upload of {key}")));
            let id = created.upload_id().expect("an upload id").to_string();
            self.client
                .upload_part()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(&id)
                .part_number(1)
                .body(part.to_vec().into())
                .send()
                .await
                .unwrap_or_else(refused(format!("part 1 of {key}")));
            id
        })
    }

    /// Completes the upload `id` of `key` started by
    /// [`BucketClient::start_upload`] with its part 1; panics when the
    /// store refuses (an upload aborted meanwhile, say).
    pub fn complete_upload(&self, key: &str, id: &str) {
        self.runtime.block_on(async {
            use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
            let parts = self
                .client
                .list_parts()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(id)
                .send()
                .await
                .unwrap_or_else(refused(format!("parts of {key}")));
            let completed: Vec<CompletedPart> = parts
                .parts()
                .iter()
                .map(|p| {
                    CompletedPart::builder()
                        .set_part_number(p.part_number())
                        .set_e_tag(p.e_tag().map(str::to_string))
                        .build()
                })
                .collect();
            self.client
                .complete_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(completed))
                        .build(),
                )
                .send()
                .await
                .unwrap_or_else(refused(format!("complete {key}")));
        })
    }

    /// The unfinished multipart uploads whose keys start with `prefix`, as
    /// (key, upload id); panics when the store refuses.
    pub fn uploads(&self, prefix: &str) -> Vec<(String, String)> {
        self.runtime.block_on(async {
            let page = self
                .client
                .list_multipart_uploads()
                .bucket(&self.bucket)
                .prefix(prefix)
                .send()
                .await
                .unwrap_or_else(refused(format!("uploads under {prefix}")));
            page.uploads()
                .iter()
                .filter_map(|u| Some((u.key()?.to_string(), u.upload_id()?.to_string())))
                .collect()
        })
    }
}

/// A panic naming `what` the store refused, with the SDK's whole error.
fn refused<E: std::error::Error, T>(what: String) -> impl FnOnce(E) -> T {
    move |e| panic!("{what}: {}", aws_sdk_s3::error::DisplayErrorContext(e))
}
