//! The web console (`/admin/console/` on the admin API's listener): in a
//! real browser (headless chromium through chromedriver) against a sidecar
//! on real PostgreSQL, the mock Kafka cluster and a scripted receiver; and
//! with a plain HTTP client, that no page or action works without a
//! session and no POST without the session's CSRF token.

use std::time::Duration;

use entity::Status;
use serde_json::{json, Value};
use wiremock::ResponseTemplate;

use crate::harness::browser::Browser;
use crate::harness::{eventually, spawn_app_with, Options, Receiver, TestApp};

const T: Duration = Duration::from_secs(30);
const TOKEN: &str = "test-admin-token-0123456789";

/// Events whose payload says `"reject": true` fail their first three
/// requests (R-004's three attempts: `failed`) and succeed from then on, so
/// a resend sends them.
async fn rejecting_receiver() -> Receiver {
    Receiver::start(|r| {
        let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        if body["reject"] == true && r.nth < 3 {
            ResponseTemplate::new(503).set_body_string("receiver down for maintenance")
        } else {
            ResponseTemplate::new(204)
        }
    })
    .await
}

async fn failed_events(t: &TestApp, names: &[&str]) -> Vec<i64> {
    let mut ids = Vec::new();
    for name in names {
        ids.push(t.insert(name, json!({"reject": true, "order": 42})).await);
    }
    for id in &ids {
        t.wait_status(*id, Status::Failed, T).await;
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_browser_sign_in_see_a_failure_resend_it_and_resend_in_bulk() {
    let t = spawn_app_with(Options::default(), rejecting_receiver().await).await;
    let ids = failed_events(
        &t,
        &[
            "accounts.purchase_create",
            "accounts.installment_overdue",
            "accounts.installment_overdue",
            "accounts.installment_paid",
        ],
    )
    .await;
    let (one, bulk, other) = (ids[0], &ids[1..3], ids[3]);
    let sent = t.insert("accounts.purchase_create", json!({})).await;
    t.wait_status(sent, Status::Sent, T).await;

    let b = Browser::start().await;
    let base = t.api_url("");

    // No session: every page leads to the sign-in page.
    b.goto(&format!("{base}/admin/")).await;
    assert_eq!(
        b.path_becomes("/admin/console/signin").await,
        "/admin/console/signin"
    );
    // A wrong token: the sign-in page again, with a message and no detail.
    b.fill("input[name=token]", "not-the-admin-token-at-all")
        .await;
    b.click("button[type=submit]").await;
    assert_eq!(b.text("#message").await, "Sign-in failed.");
    b.goto(&format!("{base}/admin/console/events")).await;
    assert_eq!(
        b.path_becomes("/admin/console/signin").await,
        "/admin/console/signin"
    );

    b.fill("input[name=token]", TOKEN).await;
    b.click("button[type=submit]").await;
    assert_eq!(b.path_becomes("/admin/console/").await, "/admin/console/");
    assert_eq!(b.text("#count-failed").await, "4");
    assert_eq!(b.text("#count-sent").await, "1");
    assert_eq!(b.text("#count-pending").await, "0");
    assert!(b.text("#fetching").await.starts_with("running"));
    assert!(b
        .text("#dispatchers")
        .await
        .contains("accounts.installment_overdue"));
    // The chart of the last hour: its bars and totals are the log's.
    let (mut logged_ok, mut logged_failed) = (0, 0);
    for id in ids.iter().chain([&sent]) {
        for r in t.store.history(*id).await.unwrap() {
            match r.outcome.as_deref() {
                Some("success") => logged_ok += 1,
                Some("failure") => logged_failed += 1,
                _ => {}
            }
        }
    }
    assert_eq!((logged_ok, logged_failed), (1, 12));
    b.find("#chart-all svg").await;
    assert_eq!(b.text("#chart-all .chart-ok").await, logged_ok.to_string());
    assert_eq!(
        b.text("#chart-all .chart-failed").await,
        logged_failed.to_string()
    );
    let page = b.client.source().await.unwrap();
    let bars = |attr: &str| -> i64 {
        page.split(&format!("{attr}=\""))
            .skip(1)
            .map(|v| v.split('"').next().unwrap().parse::<i64>().unwrap())
            .sum()
    };
    assert_eq!((bars("data-ok"), bars("data-failed")), (1, 12), "{page}");
    assert_eq!(page.matches("class=\"minute\"").count(), 60);
    b.screenshot("console-overview.png").await;

    // The events list shows the failed ones, newest first; the first
    // failed event's page shows its error and attempts.
    b.click("#count-failed a").await;
    let list = b.text("#events").await;
    let positions: Vec<usize> = ids
        .iter()
        .rev()
        .map(|id| {
            list.find(&format!("\n{id} "))
                .expect("every failed event listed")
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "newest first: {list}"
    );
    assert!(
        !list.contains(&format!("\n{sent} ")),
        "sent events are not listed"
    );
    b.click(&format!("#events a[href='/admin/console/events/{one}']"))
        .await;
    assert_eq!(b.text("#status").await, "failed");
    assert_eq!(b.text("#attempts").await, "3");
    assert_eq!(
        b.text("#last-error").await,
        "HTTP 503: receiver down for maintenance"
    );
    // The attempt timeline: three failures, each with the receiver's 503.
    let timeline = b.text("#timeline").await;
    assert_eq!(timeline.matches("failure").count(), 3, "{timeline}");
    assert_eq!(
        timeline.matches("503").count(),
        6,
        "status and detail: {timeline}"
    );
    assert!(b.text("#payload").await.contains("\"order\": 42"));
    b.screenshot("console-event.png").await;
    assert_eq!(t.receiver.for_id(one).len(), 3);

    // Resend it: the page says so, and a refresh shows it sent.
    b.click("#resend").await;
    assert!(b.text("#notice").await.contains("set to pending"));
    eventually("the event page to show the event sent", T, || async {
        b.goto(&format!("{base}/admin/console/events/{one}")).await;
        (b.text("#status").await == "sent").then_some(())
    })
    .await;
    assert_eq!(t.receiver.for_id(one).len(), 4);
    // The timeline now shows the resend (made in the console) and the success.
    let timeline = b.text("#timeline").await;
    assert!(timeline.contains("resend"), "{timeline}");
    assert!(timeline.contains("console"), "{timeline}");
    assert!(timeline.contains("success"), "{timeline}");

    // A filtered bulk resend: the dry run counts and samples, the confirm
    // resends exactly those.
    b.goto(&format!("{base}/admin/console/resend")).await;
    b.fill("input[name=event_name]", "accounts.installment_overdue")
        .await;
    b.fill("input[name=error_contains]", "HTTP 503").await;
    b.click("#dry-run").await;
    assert_eq!(
        b.text("#would-resend").await,
        "2 failed events would be resent."
    );
    b.find("#sample").await;
    let page = b.client.source().await.unwrap();
    let linked = |id: i64| page.contains(&format!("href=\"/admin/console/events/{id}\""));
    assert!(bulk.iter().all(|id| linked(*id)), "{page}");
    assert!(!linked(other), "{page}");
    for id in bulk {
        assert_eq!(
            t.row(*id).await.status,
            Status::Failed,
            "a dry run changes nothing"
        );
    }
    b.click("#confirm").await;
    assert_eq!(b.text("#result").await, "2 events set to pending.");
    for id in bulk {
        t.wait_status(*id, Status::Sent, T).await;
    }
    assert_eq!(t.row(other).await.status, Status::Failed);

    // Sign out: the session is gone.
    b.click("header button[type=submit]").await;
    assert_eq!(b.text("#message").await, "Signed out.");
    b.goto(&format!("{base}/admin/console/")).await;
    assert_eq!(
        b.path_becomes("/admin/console/signin").await,
        "/admin/console/signin"
    );
    b.close().await;
}

/// Pause the dispatcher in the console: new events stay pending with no
/// attempt used; resume: each is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_pauses_and_resumes_a_dispatcher() {
    let t = spawn_app_with(Options::default(), Receiver::accepting().await).await;
    let b = Browser::start().await;
    let base = t.api_url("");
    b.goto(&format!("{base}/admin/console/signin")).await;
    b.fill("input[name=token]", TOKEN).await;
    b.click("button[type=submit]").await;
    b.goto(&format!("{base}/admin/console/dispatchers")).await;
    assert!(b
        .text("#dispatcher-accounts .state")
        .await
        .starts_with("sending"));
    b.fill("#dispatcher-accounts input[name=label]", "accounts deploy")
        .await;
    b.click("#dispatcher-accounts button.pause").await;
    assert_eq!(
        b.text("#notice").await,
        "dispatcher accounts paused: its events stay pending, no attempt is used"
    );
    let state = b.text("#dispatcher-accounts .state").await;
    assert!(
        state.contains("paused since") && state.ends_with("via console (accounts deploy)"),
        "{state}"
    );
    let metrics = t.admin_url("");
    eventually("the replica to see the pause", T, || {
        let metrics = metrics.clone();
        async move {
            let v = crate::harness::metric(
                &metrics,
                "outbox_dispatcher_paused{dispatcher=\"accounts\"}",
            )
            .await?;
            (v == 1.0).then_some(())
        }
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    t.wait_all_committed(&t.group, T).await;
    for id in &ids {
        let row = t.row(*id).await;
        assert_eq!(
            (row.status, row.attempts),
            (Status::Pending, 0),
            "event {id}"
        );
    }
    assert!(
        t.receiver.requests().is_empty(),
        "nothing sent while paused"
    );
    b.goto(&format!("{base}/admin/console/events/{}", ids[0]))
        .await;
    assert_eq!(b.text("#status").await, "pending");
    assert!(b.text("#timeline").await.starts_with("no attempt recorded"));
    // Why it waits, on its page: the pause, and the command that ends it.
    let why = b.text("#why-summary").await;
    assert!(
        why.starts_with("paused: dispatcher accounts is paused"),
        "{why}"
    );
    assert_eq!(
        b.text("#why-action").await,
        "Do: resume it when its receiver is ready: `dispatchers resume accounts`"
    );

    b.goto(&format!("{base}/admin/console/dispatchers")).await;
    b.click("#dispatcher-accounts button.resume").await;
    // The resume runs as an operation; its page follows it to its end.
    assert_eq!(
        b.text("#result").await,
        "dispatcher accounts resumed: 3 pending event(s) announced again"
    );
    assert_eq!(b.text("#op-state").await, "done");
    assert_eq!(b.text("#op-progress").await, "3");
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
        assert_eq!(t.receiver.for_id(*id).len(), 1, "event {id} sent once");
    }
    eventually("the page to show the sends", T, || async {
        b.goto(&format!("{base}/admin/console/dispatchers")).await;
        let rate = b.text("#dispatcher-accounts .rate").await;
        (rate == "0 failed of 3 (0%)").then_some(())
    })
    .await;
    assert!(b
        .text("#dispatcher-accounts .state")
        .await
        .starts_with("sending"));
    b.close().await;
}

pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn location(r: &reqwest::Response) -> &str {
    r.headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A urlencoded form body.
fn form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// The session's CSRF token, as the page's forms carry it.
fn csrf_of(page: &str) -> String {
    let at = page
        .find(r#"name="csrf" value=""#)
        .expect("a form with the CSRF token");
    let rest = &page[at + r#"name="csrf" value=""#.len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_refuses_every_page_and_action_without_a_session_and_posts_without_csrf() {
    let t = spawn_app_with(Options::default(), rejecting_receiver().await).await;
    let ids = failed_events(&t, &["accounts.purchase_create"]).await;
    let id = ids[0];
    let http = no_redirects();
    let url = |p: &str| t.api_url(p);

    let pages = [
        "/admin/console/".to_owned(),
        "/admin/console/events".to_owned(),
        "/admin/console/events?status=all".to_owned(),
        format!("/admin/console/events/{id}"),
        "/admin/console/resend".to_owned(),
        "/admin/console/resend?preview=1".to_owned(),
        "/admin/console/dispatchers".to_owned(),
    ];
    let actions = [
        (format!("/admin/console/events/{id}/resend"), "csrf=x"),
        (
            "/admin/console/resend".to_owned(),
            "csrf=x&event_name=accounts.purchase_create",
        ),
        ("/admin/console/signout".to_owned(), "csrf=x"),
        (
            "/admin/console/dispatchers/accounts/pause".to_owned(),
            "csrf=x",
        ),
        (
            "/admin/console/dispatchers/accounts/resume".to_owned(),
            "csrf=x",
        ),
    ];
    // No cookie, and a cookie no session has.
    for cookie in [None, Some("outbox_console=00ff00ff")] {
        for p in &pages {
            let mut req = http.get(url(p));
            if let Some(c) = cookie {
                req = req.header("cookie", c);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 303, "GET {p} with {cookie:?}");
            assert_eq!(location(&r), "/admin/console/signin", "GET {p}");
        }
        for (p, body) in &actions {
            let mut req = http
                .post(url(p))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(*body);
            if let Some(c) = cookie {
                req = req.header("cookie", c);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 303, "POST {p} with {cookie:?}");
            assert_eq!(location(&r), "/admin/console/signin", "POST {p}");
        }
    }
    assert_eq!(t.row(id).await.status, Status::Failed, "nothing was resent");
    assert!(
        t.store.pauses().await.unwrap().is_empty(),
        "nothing was paused"
    );

    // A wrong token: 401, the sign-in page with a message, no cookie.
    let r = http
        .post(url("/admin/console/signin"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", "test-admin-token-012345678")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("set-cookie").is_none());
    assert!(r.text().await.unwrap().contains("Sign-in failed."));

    // The right token: a session cookie, HttpOnly, SameSite=Strict, with
    // an expiry.
    let r = http
        .post(url("/admin/console/signin"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", TOKEN)]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(location(&r), "/admin/console/");
    let set_cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    let (pair, attrs) = set_cookie.split_once(';').unwrap();
    assert_eq!(
        attrs.trim(),
        "Path=/admin; Max-Age=28800; HttpOnly; SameSite=Strict"
    );
    let cookie = pair.to_owned();
    assert_eq!(cookie.len(), "outbox_console=".len() + 64, "{cookie}");

    let page = http
        .get(url(&format!("/admin/console/events/{id}")))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["cache-control"], "no-store");
    let csrf = csrf_of(&page.text().await.unwrap());
    assert_eq!(csrf.len(), 64);

    // A POST without the CSRF token, or with a wrong one, is refused and
    // changes nothing.
    let resend = format!("/admin/console/events/{id}/resend");
    let bulk = "/admin/console/resend";
    for body in [
        String::new(),
        "csrf=".to_owned(),
        format!("csrf={}", &csrf[..63]),
        format!("csrf={}0", csrf),
        "event_name=accounts.purchase_create".to_owned(),
        format!(
            "event_name=accounts.purchase_create&csrf={}",
            csrf.to_uppercase()
        ),
    ] {
        for p in [
            &resend,
            &bulk.to_owned(),
            &"/admin/console/dispatchers/accounts/pause".to_owned(),
        ] {
            let r = http
                .post(url(p))
                .header("cookie", &cookie)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 403, "POST {p} with {body:?}");
            assert!(r
                .text()
                .await
                .unwrap()
                .contains("CSRF token is missing or wrong"));
        }
    }
    assert_eq!(t.row(id).await.status, Status::Failed, "nothing was resent");
    assert_eq!(t.receiver.for_id(id).len(), 3);
    assert!(
        t.store.pauses().await.unwrap().is_empty(),
        "nothing was paused"
    );

    // The events list's filters: error text and failure time.
    let list = |query: &'static str| {
        let http = http.clone();
        let cookie = cookie.clone();
        let u = url(&format!("/admin/console/events?{query}"));
        async move {
            let r = http.get(u).header("cookie", cookie).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let link = format!("href=\"/admin/console/events/{id}\"");
    let (status, page) = list("error_contains=HTTP+503&failed_since=2000-01-01+00:00").await;
    assert_eq!(status, 200);
    assert!(page.contains(&link), "{page}");
    for query in [
        "error_contains=HTTP+500",
        "failed_since=2999-01-01T00:00:00Z",
        "failed_until=2000-01-01+00:00",
        "status=sent",
        "event_name=accounts.installment_paid",
    ] {
        let (status, page) = list(query).await;
        assert_eq!(status, 200, "{query}");
        assert!(!page.contains(&link), "{query}: {page}");
        assert!(page.contains("No events."), "{query}");
    }
    let (status, page) = list("failed_since=noon").await;
    assert_eq!(status, 400);
    assert!(
        page.contains("failed_since: &quot;noon&quot; is not a time"),
        "{page}"
    );

    // The session's cookie is no bearer token: the JSON API still refuses.
    let r = http
        .get(url("/admin/events"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // With the token, the same POST works.
    let r = http
        .post(url(&resend))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("csrf", csrf.as_str())]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(
        location(&r),
        format!("/admin/console/events/{id}?resent=true")
    );
    t.wait_status(id, Status::Sent, T).await;

    // Cursor paging: 50 a page, newest first, with the API's cursor.
    let mut newer = Vec::new();
    for _ in 0..50 {
        newer.push(t.insert("accounts.installment_paid", json!({})).await);
    }
    for n in &newer {
        t.wait_status(*n, Status::Sent, T).await;
    }
    let get = |path: String| {
        let req = http.get(url(&path)).header("cookie", &cookie);
        async move { req.send().await.unwrap().text().await.unwrap() }
    };
    let linked =
        |page: &str, id: i64| page.contains(&format!("href=\"/admin/console/events/{id}\""));
    let first = get("/admin/console/events?status=sent".into()).await;
    assert!(newer.iter().all(|n| linked(&first, *n)));
    assert!(!linked(&first, id), "the oldest is on the next page");
    let next = {
        let at = first.find("id=\"next\" href=\"").expect("a next page link")
            + "id=\"next\" href=\"".len();
        first[at..at + first[at..].find('"').unwrap()].replace("&amp;", "&")
    };
    assert_eq!(
        next,
        format!("/admin/console/events?status=sent&before={}", newer[0])
    );
    let second = get(next).await;
    assert!(linked(&second, id));
    assert!(!second.contains("id=\"next\""), "the last page");

    // Signed out, the cookie opens nothing.
    let r = http
        .post(url("/admin/console/signout"))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("csrf", csrf.as_str())]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
    let r = http
        .get(url("/admin/console/"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(location(&r), "/admin/console/signin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_is_disabled_without_an_admin_token() {
    let t = spawn_app_with(
        Options {
            admin_token: None,
            ..Options::default()
        },
        Receiver::accepting().await,
    )
    .await;
    let http = no_redirects();
    let r = http
        .get(t.api_url("/admin/console/signin"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("set admin.token"));
    let r = http
        .post(t.api_url("/admin/console/signin"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", "")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = http.get(t.api_url("/admin/console/")).send().await.unwrap();
    assert_eq!(r.status(), 403);
}

/// Signs in with a plain HTTP client: the session cookie and its CSRF token.
pub async fn signed_in(t: &TestApp, http: &reqwest::Client) -> (String, String) {
    let r = http
        .post(t.api_url("/admin/console/signin"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", TOKEN)]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = http
        .get(t.api_url("/admin/console/resend"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    (cookie.clone(), csrf_of(&page))
}

/// The value of the hidden `confirm` field of the bulk page's confirming
/// form, if it has one.
fn confirm_of(page: &str) -> Option<String> {
    let at = page.find(r#"name="confirm" value=""#)? + r#"name="confirm" value=""#.len();
    Some(page[at..at + page[at..].find('"').unwrap()].to_owned())
}

/// The console refuses a form field or query key its forms do not have
/// (400 naming it, nothing changed), parses its booleans strictly, and its
/// bulk resend takes the count the dry run showed: when the count changed
/// in between, nothing is resent and the dry run is shown again with the
/// new count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_refuses_unknown_fields_and_a_resend_whose_count_changed() {
    let t = spawn_app_with(Options::default(), rejecting_receiver().await).await;
    let ids = failed_events(
        &t,
        &[
            "accounts.purchase_create",
            "accounts.purchase_create",
            "accounts.purchase_create",
        ],
    )
    .await;
    let http = no_redirects();
    let (cookie, csrf) = signed_in(&t, &http).await;
    let get = |path: &str| {
        let req = http.get(t.api_url(path)).header("cookie", &cookie);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let post = |path: &str, fields: Vec<(&str, String)>| {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        let req = http
            .post(t.api_url(path))
            .header("cookie", &cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let unchanged = || async {
        for id in &ids {
            let row = t.row(*id).await;
            assert_eq!(
                (row.status, row.attempts),
                (Status::Failed, 3),
                "event {id}"
            );
        }
        assert!(t.store.pauses().await.unwrap().is_empty(), "nothing paused");
    };

    // Pages: an unknown query key, a key twice, a boolean that is not
    // `true`/`false`.
    for (path, names) in [
        (
            "/admin/console/events?eventname=x",
            "unknown query parameter `eventname`; expected one of: status, event_name,",
        ),
        (
            "/admin/console/events?status=all&status=failed",
            "query parameter `status` is given twice",
        ),
        (
            "/admin/console/resend?preview=true&error=503",
            "unknown query parameter `error`; expected one of: event_name,",
        ),
        (
            "/admin/console/resend?preview=1",
            "query parameter `preview`: expected `true` or `false`, not &quot;1&quot;",
        ),
        (
            "/admin/console/resend?preview=yes",
            "query parameter `preview`: expected `true` or `false`",
        ),
        (
            &format!("/admin/console/events/{}?resent=1", ids[0]),
            "query parameter `resent`: expected `true` or `false`",
        ),
        (
            "/admin/console/dispatchers?x=1",
            "unknown query parameter `x`: this route takes none",
        ),
        (
            "/admin/console/?x=1",
            "unknown query parameter `x`: this route takes none",
        ),
    ] {
        let (status, page) = get(path).await;
        assert_eq!(status, 400, "GET {path}: {page}");
        assert!(page.contains(names), "GET {path}: {page}");
    }
    // Forms: a field the form does not have.
    let bulk = "/admin/console/resend";
    for (path, fields, names) in [
        (
            bulk.to_owned(),
            vec![("event_name", "accounts.purchase_create".to_owned()), ("eventname", "x".to_owned())],
            "unknown form field `eventname`; expected one of: event_name, dispatcher, error_contains, failed_since, failed_until, csrf, confirm",
        ),
        (
            bulk.to_owned(),
            vec![("error", "503".to_owned()), ("confirm", "3".to_owned())],
            "unknown form field `error`",
        ),
        (
            format!("/admin/console/events/{}/resend", ids[0]),
            vec![("label", "x".to_owned())],
            "unknown form field `label`; expected one of: csrf",
        ),
        (
            "/admin/console/dispatchers/accounts/pause".to_owned(),
            vec![("reason", "deploy".to_owned())],
            "unknown form field `reason`; expected one of: csrf, label",
        ),
    ] {
        let mut with_csrf = vec![("csrf", csrf.clone())];
        with_csrf.extend(fields);
        let (status, page) = post(&path, with_csrf).await;
        assert_eq!(status, 400, "POST {path}: {page}");
        assert!(page.contains(names), "POST {path}: {page}");
        unchanged().await;
    }

    // The two steps: the dry run's form carries its count...
    let (status, page) =
        get("/admin/console/resend?event_name=accounts.purchase_create&preview=true").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(confirm_of(&page).as_deref(), Some("3"), "{page}");
    // ...one of the three is resent meanwhile, so 2 match: nothing is
    // resent, the dry run again with 2.
    let r = reqwest::Client::new()
        .post(t.api_url(&format!("/admin/events/{}/retry", ids[0])))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    t.wait_status(ids[0], Status::Sent, T).await;
    let confirm = |n: &str| {
        vec![
            ("csrf", csrf.clone()),
            ("event_name", "accounts.purchase_create".to_owned()),
            ("confirm", n.to_owned()),
        ]
    };
    let (status, page) = post(bulk, confirm("3")).await;
    assert_eq!(status, 409, "{page}");
    assert!(
        page.contains("The dry run counted 3; 2 failed event(s) match now. Nothing was resent"),
        "{page}"
    );
    assert_eq!(confirm_of(&page).as_deref(), Some("2"), "{page}");
    for id in &ids[1..] {
        assert_eq!(t.row(*id).await.status, Status::Failed, "event {id}");
    }
    // The confirmed resend runs as an operation: 303 to its page, which
    // shows its end.
    let form = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(confirm("2"))
        .finish();
    let r = http
        .post(t.api_url(bulk))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let op_page = location(&r).to_owned();
    assert!(
        op_page.starts_with("/admin/console/operations/op-"),
        "{op_page}"
    );
    eventually("the resend operation to end", T, || async {
        let (status, page) = get(&op_page).await;
        assert_eq!(status, 200, "{page}");
        page.contains("2 events set to pending.").then_some(())
    })
    .await;
    for id in &ids[1..] {
        t.wait_status(*id, Status::Sent, T).await;
    }
}

/// The Replay page in a browser: a dry run counts the sent events of the
/// window, the confirm starts the replay and goes to its operation's page,
/// which follows it to `done`; every event is sent once more, with
/// `Outbox-Replay`, and the event's timeline shows the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_replay_in_a_browser_dry_run_then_replay() {
    let t = spawn_app_with(Options::default(), Receiver::accepting().await).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            t.insert("accounts.installment_paid", json!({ "n": i }))
                .await,
        );
    }
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    let b = Browser::start().await;
    let base = t.api_url("");
    b.goto(&format!("{base}/admin/console/replay")).await;
    assert_eq!(
        b.path_becomes("/admin/console/signin").await,
        "/admin/console/signin"
    );
    b.fill("input[name=token]", TOKEN).await;
    b.click("button[type=submit]").await;
    b.path_becomes("/admin/console/").await;
    b.goto(&format!("{base}/admin/console/replay")).await;
    // No window: refused, naming the field.
    b.click("#dry-run").await;
    assert!(
        b.text("#error")
            .await
            .contains("sent_since or sent_until is required"),
        "{}",
        b.text("#error").await
    );
    b.fill("input[name=sent_since]", "2000-01-01 00:00").await;
    b.fill("input[name=event_name]", "accounts.installment_paid")
        .await;
    b.click("#dry-run").await;
    assert_eq!(
        b.text("#would-replay").await,
        format!(
            "5 sent events would be replayed at 100/s, ids {}..{}.",
            ids[0], ids[4]
        )
    );
    b.screenshot("console-replay.png").await;
    for id in &ids {
        assert_eq!(t.receiver.for_id(*id).len(), 1, "a dry run sends nothing");
    }
    b.fill("input[name=label]", "INC-7 receiver restore").await;
    b.click("#confirm").await;
    // The confirm redirects to the operation's page.
    let path = eventually("the operation's page", T, || async {
        let path = b.path().await;
        path.starts_with("/admin/console/operations/op-")
            .then_some(path)
    })
    .await;
    let op = path.rsplit('/').next().unwrap().to_owned();
    eventually("the replay's page to show it done", T, || async {
        b.goto(&format!("{base}{path}")).await;
        (b.text("#op-state").await == "done").then_some(())
    })
    .await;
    assert_eq!(b.text("#op-progress").await, "5");
    for id in &ids {
        eventually("the replayed request", T, || async {
            let reqs = t.receiver.for_id(*id);
            (reqs.len() == 2).then_some(reqs)
        })
        .await;
        let reqs = t.receiver.for_id(*id);
        assert_eq!(reqs[1].headers.get("outbox-replay"), Some(&op));
    }
    b.goto(&format!("{base}/admin/console/events/{}", ids[0]))
        .await;
    let timeline = b.text("#timeline").await;
    assert!(timeline.contains("replay"), "{timeline}");
    assert!(timeline.contains(&op), "{timeline}");
    b.close().await;
}
