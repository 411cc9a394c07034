//! A real browser for the console tests: Debian's `chromium`, headless,
//! driven through `chromedriver` (WebDriver) with fantoccini. The driver is
//! started per test on a free port and killed when the test ends. A
//! missing driver fails the test: CI installs it (`.ci/run`, `make test`).

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;

/// `chromedriver`, or `OUTBOX_TEST_CHROMEDRIVER`.
fn driver_path() -> String {
    std::env::var("OUTBOX_TEST_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".to_owned())
}

/// A running chromedriver and a browser session on it.
pub struct Browser {
    pub client: Client,
    driver: Driver,
}

/// chromedriver in a process group of its own, with the browser it starts:
/// killed as a group when dropped, so a test that fails (its session never
/// closed) leaves no driver and no browser behind.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Browser {
    pub async fn start() -> Browser {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("its address").port()
        };
        let path = driver_path();
        let mut driver = match Command::new(&path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
        {
            Ok(child) => Driver(child),
            Err(e) => panic!(
                "cannot start {path:?} ({e}): the console tests need a real browser; install \
                 chromium and chromium-driver (apt-get install -y chromium chromium-driver; \
                 .ci/run and `make test` install them), or point OUTBOX_TEST_CHROMEDRIVER at \
                 a chromedriver"
            ),
        };
        let mut browser_opts = json!({
            "args": [
                "--headless=new",
                // CI runs as root, where chromium's sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--window-size=1280,900",
                // No crash handler: it would outlive the browser.
                "--disable-crash-reporter",
                "--disable-breakpad",
            ]
        });
        if std::path::Path::new("/usr/bin/chromium").exists() {
            browser_opts["binary"] = json!("/usr/bin/chromium");
        }
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".to_owned(), browser_opts);
        let url = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let client = loop {
            let attempt = ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await;
            match attempt {
                Ok(c) => break c,
                Err(e) => {
                    if let Ok(Some(status)) = driver.0.try_wait() {
                        panic!("{path} exited ({status}) before a session started: {e}");
                    }
                    if tokio::time::Instant::now() > deadline {
                        panic!("no browser session from {path} on {url} within 30s: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        Browser { client, driver }
    }

    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// The text of the element `css` selects, waiting for it (a page that
    /// is still loading) up to 20 s.
    pub async fn text(&self, css: &str) -> String {
        let el = self.find(css).await;
        el.text()
            .await
            .unwrap_or_else(|e| panic!("text of {css}: {e}"))
    }

    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match self.client.find(Locator::Css(css)).await {
                Ok(el) => return el,
                Err(e) => {
                    if tokio::time::Instant::now() > deadline {
                        let url = self.client.current_url().await.map(|u| u.to_string());
                        let page = self.client.source().await.unwrap_or_default();
                        panic!("no {css} on {url:?} within 20s ({e}); the page:\n{page}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    pub async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    pub async fn fill(&self, css: &str, text: &str) {
        let el = self.find(css).await;
        el.clear()
            .await
            .unwrap_or_else(|e| panic!("clear {css}: {e}"));
        el.send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    pub async fn path(&self) -> String {
        self.client
            .current_url()
            .await
            .expect("the current URL")
            .path()
            .to_owned()
    }

    /// The current path once it is `expected`, or as it is after 20 s: a
    /// click that submits a form may return before the browser has
    /// followed the answer's redirect (seen under load).
    pub async fn path_becomes(&self, expected: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let path = self.path().await;
            if path == expected || tokio::time::Instant::now() > deadline {
                return path;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A PNG of the window, written to `target/console-screenshots/NAME`,
    /// and to `docs/NAME` as well with `OUTBOX_UPDATE_SCREENSHOTS=1` (the
    /// README's pictures; not rewritten by every test run).
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("a screenshot");
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = root.join("target/console-screenshots");
        std::fs::create_dir_all(&dir).expect("the screenshot folder");
        std::fs::write(dir.join(name), &png).expect("write the screenshot");
        if std::env::var("OUTBOX_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
            std::fs::create_dir_all(root.join("docs")).expect("the docs folder");
            std::fs::write(root.join("docs").join(name), &png).expect("write docs/ screenshot");
        }
    }

    /// Ends the session (the browser quits), then the driver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
        drop(self.driver);
    }
}
