//! TLS to dispatchers (issue 17, item 9): per-dispatcher `ca_file`,
//! `client_cert_file` / `client_key_file` (mTLS) and `min_tls_version`,
//! against real rustls HTTPS receivers whose CA each test makes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entity::Status;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;

use crate::harness::{prepare_on, Kafka, Options, Receiver};

/// A CA made for one test, and the certificates it issued.
struct TestCa {
    pem: String,
    der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `names`: its certificate and PKCS#8 key, PEM and DER.
    fn issue(&self, names: &[&str]) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = CertificateParams::new(names).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }
}

struct Leaf {
    cert_pem: String,
    key_pem: String,
    cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// An HTTPS receiver on 127.0.0.1 that answers every POST with 204 and
/// counts them, and the client certificates it was shown.
struct TlsReceiver {
    url: String,
    requests: Arc<AtomicUsize>,
    client_certs: Arc<AtomicUsize>,
}

impl TlsReceiver {
    /// `client_ca`: require a client certificate issued by it (mTLS).
    /// `versions`: the TLS versions it speaks.
    async fn start(
        server: &Leaf,
        client_ca: Option<&TestCa>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Self {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .unwrap();
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca.der.clone()).unwrap();
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server.key_der.clone()));
        let config = builder
            .with_single_cert(vec![server.cert_der.clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let client_certs = Arc::new(AtomicUsize::new(0));
        let (req_count, cert_count) = (requests.clone(), client_certs.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let (req_count, cert_count) = (req_count.clone(), cert_count.clone());
                tokio::spawn(async move {
                    // A refused handshake (wrong CA, no client certificate,
                    // old version) ends here; the sidecar sees it as a failure.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if tls.get_ref().1.peer_certificates().is_some() {
                        cert_count.fetch_add(1, Ordering::SeqCst);
                    }
                    let service = hyper::service::service_fn(move |_req| {
                        req_count.fetch_add(1, Ordering::SeqCst);
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(204)
                                    .body(String::new())
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            url: format!("https://127.0.0.1:{}/api/v1/events", addr.port()),
            requests,
            client_certs,
        }
    }
}

fn dispatcher(name: &str, url: &str, event: &str, extra: &str) -> String {
    format!(
        "[dispatchers.{name}]\nurl = \"{url}\"\nevents = [\"{event}\"]\ntimeout = \"2s\"\n{extra}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_dispatcher_trusts_its_ca_file_and_fails_readably_on_a_wrong_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("outbox test CA");
    let other_ca = TestCa::new("some other CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem);
    let other_ca_file = write(dir.path(), "other-ca.pem", &other_ca.pem);
    // The receiver speaks TLS 1.2 only, so that min_tls_version = "1.3"
    // is refused by the handshake.
    let server = ca.issue(&["localhost", "127.0.0.1"]);
    let receiver = TlsReceiver::start(&server, None, &[&rustls::version::TLS12]).await;

    let extra = [
        dispatcher(
            "good",
            &receiver.url,
            "tls.good",
            &format!("ca_file = {:?}\nmin_tls_version = \"1.2\"", ca_file),
        ),
        dispatcher(
            "wrong_ca",
            &receiver.url,
            "tls.wrong_ca",
            &format!("ca_file = {:?}", other_ca_file),
        ),
        dispatcher(
            "tls13",
            &receiver.url,
            "tls.tls13",
            &format!("ca_file = {:?}\nmin_tls_version = \"1.3\"", ca_file),
        ),
    ]
    .concat();
    let opts = Options {
        extra_toml: extra,
        ..Options::default()
    };
    let mut t = prepare_on(Kafka::start(), opts, Receiver::accepting().await).await;
    t.start().await;

    let good = t.insert("tls.good", json!({"n": 1})).await;
    let wrong = t.insert("tls.wrong_ca", json!({"n": 2})).await;
    let tls13 = t.insert("tls.tls13", json!({"n": 3})).await;
    let limit = Duration::from_secs(30);
    let row = t.wait_status(good, Status::Sent, limit).await;
    assert_eq!(row.attempts, 0);

    let row = t.wait_status(wrong, Status::Failed, limit).await;
    assert_eq!(
        row.attempts, 3,
        "each refused handshake is a failed attempt"
    );
    let wrong_ca_error = row.last_error.unwrap_or_default();
    assert!(
        wrong_ca_error.contains("certificate"),
        "last_error: {wrong_ca_error}"
    );
    assert!(
        !wrong_ca_error.contains("127.0.0.1"),
        "no URL in last_error: {wrong_ca_error}"
    );

    let row = t.wait_status(tls13, Status::Failed, limit).await;
    assert_eq!(row.attempts, 3);
    let error = row.last_error.unwrap_or_default();
    assert!(
        error.to_lowercase().contains("version"),
        "last_error: {error}"
    );

    // Only the trusted handshake got as far as a request.
    assert_eq!(receiver.requests.load(Ordering::SeqCst), 1);
    println!("tls: wrong CA → {wrong_ca_error:?}; min_tls_version 1.3 → {error:?}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_dispatcher_presents_its_client_certificate_to_a_receiver_requiring_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("outbox test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem);
    let server = ca.issue(&["localhost", "127.0.0.1"]);
    let client = ca.issue(&["outbox-sidecar"]);
    let cert_file = write(dir.path(), "client.pem", &client.cert_pem);
    let key_file = write(dir.path(), "client.key", &client.key_pem);
    let receiver = TlsReceiver::start(
        &server,
        Some(&ca),
        &[&rustls::version::TLS13, &rustls::version::TLS12],
    )
    .await;

    let extra = [
        dispatcher(
            "mtls",
            &receiver.url,
            "tls.mtls",
            &format!(
                "ca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}\nmin_tls_version = \"1.3\"",
                ca_file, cert_file, key_file
            ),
        ),
        dispatcher(
            "no_cert",
            &receiver.url,
            "tls.no_cert",
            &format!("ca_file = {:?}", ca_file),
        ),
    ]
    .concat();
    let opts = Options {
        extra_toml: extra,
        ..Options::default()
    };
    let mut t = prepare_on(Kafka::start(), opts, Receiver::accepting().await).await;
    t.start().await;

    let mtls = t.insert("tls.mtls", json!({"n": 1})).await;
    let no_cert = t.insert("tls.no_cert", json!({"n": 2})).await;
    let limit = Duration::from_secs(30);
    t.wait_status(mtls, Status::Sent, limit).await;
    let row = t.wait_status(no_cert, Status::Failed, limit).await;
    assert_eq!(row.attempts, 3);
    let error = row.last_error.unwrap_or_default();
    assert!(!error.is_empty());
    println!("tls: no client certificate → {error:?}");

    assert_eq!(receiver.requests.load(Ordering::SeqCst), 1);
    assert_eq!(receiver.client_certs.load(Ordering::SeqCst), 1);
    t.stop().await;
}

#[test]
fn bad_tls_files_stop_start_up_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("outbox test CA");
    let leaf = ca.issue(&["outbox-sidecar"]);
    let ca_file = write(dir.path(), "ca.pem", &ca.pem);
    let cert_file = write(dir.path(), "client.pem", &leaf.cert_pem);
    let key_file = write(dir.path(), "client.key", &leaf.key_pem);
    let not_pem = write(dir.path(), "not.pem", "hello\n");
    let other_key_file = write(
        dir.path(),
        "other.key",
        &ca.issue(&["someone-else"]).key_pem,
    );
    let missing = dir.path().join("missing.pem");
    let base = "[database]\nurl = \"sqlite::memory:\"\n[dispatchers.accounts]\nurl = \"https://accounts\"\nevents = [\"accounts.purchase_create\"]\n";
    let cases = [
        (
            format!("ca_file = {missing:?}"),
            "dispatchers.accounts.ca_file: cannot read",
        ),
        (
            format!("ca_file = {not_pem:?}"),
            "dispatchers.accounts.ca_file:",
        ),
        (
            format!("client_cert_file = {cert_file:?}"),
            "dispatchers.accounts.client_key_file: must be set together with client_cert_file",
        ),
        (
            format!("client_key_file = {key_file:?}"),
            "dispatchers.accounts.client_cert_file: must be set together with client_key_file",
        ),
        (
            format!("client_cert_file = {cert_file:?}\nclient_key_file = {missing:?}"),
            "dispatchers.accounts.client_key_file: cannot read",
        ),
        (
            format!("client_cert_file = {cert_file:?}\nclient_key_file = {not_pem:?}"),
            "dispatchers.accounts.client_key_file:",
        ),
        (
            format!("client_cert_file = {key_file:?}\nclient_key_file = {key_file:?}"),
            "dispatchers.accounts.client_cert_file:",
        ),
        (
            format!("client_cert_file = {cert_file:?}\nclient_key_file = {other_key_file:?}"),
            "dispatchers.accounts.client_key_file: cannot build the TLS client",
        ),
        (
            "min_tls_version = \"1.1\"".to_owned(),
            "dispatchers.accounts.min_tls_version",
        ),
    ];
    for (i, (extra, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, format!("{base}{extra}\n")).unwrap();
        let out = crate::cli::bin()
            .arg("--config")
            .arg(&path)
            .arg("config")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra}: {stderr}");
        assert!(stderr.contains(expected), "{extra}: {stderr}");
    }
    // The good files load.
    let path = dir.path().join("good.toml");
    std::fs::write(
        &path,
        format!("{base}ca_file = {ca_file:?}\nclient_cert_file = {cert_file:?}\nclient_key_file = {key_file:?}\nmin_tls_version = \"1.3\"\n"),
    )
    .unwrap();
    let out = crate::cli::bin()
        .arg("--config")
        .arg(&path)
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tinyproxy (Debian's package) on a free port, with Basic credentials;
/// its log says what went through it.
struct Tinyproxy {
    child: std::process::Child,
    url: String,
    log: PathBuf,
}

impl Tinyproxy {
    fn start(dir: &Path, user: &str, password: &str) -> Tinyproxy {
        Tinyproxy::spawn(dir, "auth", Some((user, password)))
    }

    /// tinyproxy with its configuration and log named `name` in `dir`.
    fn spawn(dir: &Path, name: &str, auth: Option<(&str, &str)>) -> Tinyproxy {
        let port = crate::harness::child::free_port();
        let log = dir.join(format!("tinyproxy-{name}.log"));
        let auth = auth
            .map(|(u, p)| format!("BasicAuth {u} {p}\n"))
            .unwrap_or_default();
        let conf = write(
            dir,
            &format!("tinyproxy-{name}.conf"),
            &format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 30\nLogFile \"{}\"\nLogLevel Info\n\
                 MaxClients 100\nAllow 127.0.0.1\n{auth}",
                log.display()
            ),
        );
        let child = std::process::Command::new("tinyproxy")
            .args(["-d", "-c"])
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tinyproxy (make test installs it from Debian's packages when missing)");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "tinyproxy did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Tinyproxy {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An egress proxy per dispatcher (`proxy`, `proxy_credentials_file`),
/// through a real tinyproxy: a plain HTTP receiver (the proxy forwards
/// the POST) and an HTTPS one reached through CONNECT with the
/// dispatcher's `ca_file` (TLS end to end); wrong credentials fail each
/// attempt with the proxy's refusal named (tinyproxy says 401), the password in no `last_error`;
/// a dispatcher without `proxy` goes direct.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dispatchers_go_through_their_egress_proxy_http_and_https_connect() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Tinyproxy::start(dir.path(), "egress", "pr0xy-s3cret");
    let creds = write(dir.path(), "proxy-creds", "egress:pr0xy-s3cret\n");
    let wrong = write(dir.path(), "wrong-creds", "egress:not-the-password\n");
    let ca = TestCa::new("outbox proxy test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem);
    let server = ca.issue(&["localhost", "127.0.0.1"]);
    let tls = TlsReceiver::start(&server, None, &[&rustls::version::TLS13]).await;
    let plain = Receiver::accepting().await;
    let via = |creds: &Path| {
        format!(
            "proxy = \"{}\"\nproxy_credentials_file = {:?}",
            proxy.url, creds
        )
    };
    let extra = [
        dispatcher("plain", &plain.url(), "proxy.plain", &via(&creds)),
        dispatcher(
            "secure",
            &tls.url,
            "proxy.secure",
            &format!("{}\nca_file = {:?}", via(&creds), ca_file),
        ),
        dispatcher("refused", &plain.url(), "proxy.refused", &via(&wrong)),
    ]
    .concat();
    let opts = Options {
        extra_toml: extra,
        retry_delay: "100ms",
        ..Options::default()
    };
    let mut t = prepare_on(Kafka::start(), opts, Receiver::accepting().await).await;
    t.start().await;
    let p = t.insert("proxy.plain", json!({"n": 1})).await;
    let s = t.insert("proxy.secure", json!({"n": 2})).await;
    let r = t.insert("proxy.refused", json!({"n": 3})).await;
    let direct = t.insert("accounts.purchase_create", json!({"n": 4})).await;
    for id in [p, s, direct] {
        t.wait_status(id, Status::Sent, Duration::from_secs(30))
            .await;
    }
    let refused = t
        .wait_status(r, Status::Failed, Duration::from_secs(30))
        .await;
    let error = refused.last_error.unwrap_or_default();
    // tinyproxy answers a wrong BasicAuth with 401 (a proxy should say
    // 407); either way the attempt fails naming the proxy's status.
    assert!(
        error.starts_with("HTTP 401") || error.starts_with("HTTP 407"),
        "{error}"
    );
    assert!(
        !error.contains("not-the-password") && !error.contains("pr0xy-s3cret"),
        "{error}"
    );
    assert_eq!(tls.requests.load(Ordering::SeqCst), 1);
    let log = proxy.log();
    let plain_port = plain
        .url()
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let tls_port = tls
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    assert!(
        log.contains(&format!("POST http://127.0.0.1:{plain_port}/api/v1/events")),
        "the plain POST went through the proxy: {log}"
    );
    assert!(
        log.contains(&format!("CONNECT 127.0.0.1:{tls_port}")),
        "the HTTPS receiver was reached through CONNECT: {log}"
    );
    assert_eq!(
        plain.for_id(p).len() + plain.for_id(direct).len(),
        1,
        "the direct dispatcher's receiver is the harness's own"
    );
    assert_eq!(
        t.receiver.for_id(direct).len(),
        1,
        "direct, not through the proxy"
    );
    t.stop().await;
}

impl Tinyproxy {
    /// A tinyproxy that asks for no credentials.
    fn open(dir: &Path) -> Tinyproxy {
        Tinyproxy::spawn(dir, "open", None)
    }
}

/// The environment's `HTTP_PROXY` (a sidecar process started with it, so
/// no other test sees it) takes the dispatchers' requests through the
/// proxy; the database (PostgreSQL on 127.0.0.1) and Kafka never go
/// through it (the event is read and its status written; the proxy's log
/// has the POST and nothing else).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environments_proxy_takes_the_dispatchers_requests_only() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Tinyproxy::open(dir.path());
    let t = prepare_on(
        Kafka::start(),
        Options::default(),
        Receiver::accepting().await,
    )
    .await;
    let config = crate::harness::child::write_config(&t, dir.path());
    let log = dir.path().join("sidecar.log");
    let mut s = crate::harness::child::spawn_with(
        &config,
        &log,
        &[
            ("HTTP_PROXY", proxy.url.clone()),
            ("http_proxy", proxy.url.clone()),
            ("NO_PROXY", String::new()),
            ("no_proxy", String::new()),
        ],
    );
    crate::harness::wait_ready("the sidecar", &s.base, Duration::from_secs(60)).await;
    let id = t.insert("accounts.purchase_create", json!({"n": 1})).await;
    t.wait_status(id, Status::Sent, Duration::from_secs(30))
        .await;
    let port = t
        .receiver
        .url()
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let seen = proxy.log();
    let requests: Vec<&str> = seen
        .lines()
        .filter(|l| l.contains("Request (file descriptor"))
        .collect();
    assert_eq!(requests.len(), 1, "{seen}");
    assert!(
        requests[0].contains(&format!("POST http://127.0.0.1:{port}/api/v1/events")),
        "{seen}"
    );
    let _ = s.child.kill();
    let _ = s.child.wait();
}
