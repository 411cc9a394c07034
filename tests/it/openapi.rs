//! The admin API's contract (`GET /admin/openapi.json`, generated from the
//! handlers): the live router walked against it, and real answers of
//! every route checked against its schemas.

use std::collections::BTreeSet;
use std::time::Duration;

use entity::Status;
use serde_json::{json, Value};
use wiremock::ResponseTemplate;

use crate::harness::{eventually, spawn_app_with, Options, Receiver, TestApp};

const T: Duration = Duration::from_secs(30);
const TOKEN: &str = "test-admin-token-0123456789";
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

async fn document(t: &TestApp) -> Value {
    let r = reqwest::Client::new()
        .get(t.api_url("/admin/openapi.json"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// A path of the router with its parameters filled.
fn concrete(path: &str) -> String {
    path.replace("{id}", "1").replace("{name}", "accounts")
}

/// The query parameters a route takes, from its own answer to one it does
/// not take (`unknown query parameter …; expected one of: a, b`).
fn taken(error: &str) -> Option<BTreeSet<String>> {
    if error.contains("this route takes none") {
        return Some(BTreeSet::new());
    }
    let list = error.split("expected one of: ").nth(1)?;
    Some(list.split(", ").map(|s| s.trim().to_owned()).collect())
}

/// Every route the router has, with every method: a method it does not
/// route answers 405 and must not be in the document; one it routes must
/// be, with exactly the query parameters the route takes (its 400 to an
/// unknown parameter lists them); and nothing is documented that the
/// router lacks. Unauthenticated, every documented route answers 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_and_its_openapi_document_agree() {
    let mut t = spawn_app_with(Options::default(), Receiver::accepting().await).await;
    let doc = document(&t).await;
    assert_eq!(
        doc["openapi"].as_str().map(|v| &v[..3]),
        Some("3.1"),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().unwrap();
    let routed: BTreeSet<String> = outbox_sidecar::admin::api_paths()
        .into_iter()
        .map(str::to_owned)
        .collect();
    let documented: BTreeSet<String> = paths.keys().cloned().collect();
    assert_eq!(routed, documented, "paths routed vs documented");
    let client = reqwest::Client::new();
    for path in &routed {
        for method in METHODS {
            let url = t.api_url(&format!("{}?zz_probe=1", concrete(path)));
            let r = client
                .request(method.to_uppercase().parse().unwrap(), &url)
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let op = &paths[path.as_str()][method];
            if status == 405 {
                assert!(op.is_null(), "{method} {path} is documented but not routed");
                continue;
            }
            assert!(
                !op.is_null(),
                "{method} {path} is routed ({status}) but not documented"
            );
            assert_eq!(
                status, 400,
                "{method} {path}: an unknown parameter is refused"
            );
            let body: Value = r.json().await.unwrap();
            let error = body["error"].as_str().unwrap_or_default();
            let takes = taken(error).unwrap_or_else(|| panic!("{method} {path}: {error}"));
            let params: BTreeSet<String> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "query")
                        .map(|p| p["name"].as_str().unwrap().to_owned())
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(
                params, takes,
                "{method} {path}: query parameters documented vs taken"
            );
            // Its path parameters are documented too.
            for name in ["id", "name"] {
                if path.contains(&format!("{{{name}}}")) {
                    assert!(
                        op["parameters"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|p| p["in"] == "path" && p["name"] == name),
                        "{method} {path}: path parameter {name}"
                    );
                }
            }
            // Behind the token.
            let r = client
                .request(
                    method.to_uppercase().parse().unwrap(),
                    t.api_url(&concrete(path)),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 401, "{method} {path} without the token");
        }
    }
    t.stop().await;
}

/// The schema of `method path`'s `status` answer, as a JSON Schema whose
/// `$ref`s resolve in the document's components.
fn schema_of(doc: &Value, path: &str, method: &str, status: u16) -> Value {
    let s = &doc["paths"][path][method]["responses"][status.to_string()]["content"]
        ["application/json"]["schema"];
    assert!(!s.is_null(), "{method} {path}: no schema for {status}");
    json!({ "allOf": [s], "components": doc["components"] })
}

/// Checks `body`, the answer `status` of `method path`, against the
/// document.
fn check(doc: &Value, path: &str, method: &str, status: u16, body: &Value) {
    let schema = schema_of(doc, path, method, status);
    let validator = jsonschema::validator_for(&schema)
        .unwrap_or_else(|e| panic!("{method} {path} {status}: the schema does not compile: {e}"));
    let errors: Vec<String> = validator.iter_errors(body).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{method} {path} {status}: the answer does not match the document: {errors:?}\n{body}"
    );
}

/// Real answers of every route (successes and the errors a caller meets)
/// match the document's schemas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_routes_answers_match_the_documents_schemas() {
    let receiver = Receiver::start(|r| {
        if r.event_name == "accounts.installment_overdue" {
            ResponseTemplate::new(503)
        } else {
            ResponseTemplate::new(204)
        }
    })
    .await;
    let mut t = spawn_app_with(
        Options {
            retry_delay: "100ms",
            ..Options::default()
        },
        receiver,
    )
    .await;
    let doc = document(&t).await;
    let sent = t.insert("accounts.purchase_create", json!({"n": 1})).await;
    let failed = t
        .insert("accounts.installment_overdue", json!({"n": 2}))
        .await;
    t.wait_status(sent, Status::Sent, T).await;
    t.wait_status(failed, Status::Failed, T).await;
    let client = reqwest::Client::new();
    let call = |method: &'static str, path: &str, concrete: String| {
        let client = client.clone();
        let url = t.api_url(&concrete);
        let path = path.to_owned();
        let doc = doc.clone();
        async move {
            let r = client
                .request(method.to_uppercase().parse().unwrap(), &url)
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            check(&doc, &path, method, status, &body);
            (status, body)
        }
    };
    let since = "2000-01-01T00:00:00Z";
    let cases: Vec<(&str, &str, String, u16)> = vec![
        ("get", "/admin/events", "/admin/events?limit=5".into(), 200),
        (
            "get",
            "/admin/events",
            "/admin/events?status=nope".into(),
            400,
        ),
        (
            "get",
            "/admin/events/{id}",
            format!("/admin/events/{failed}"),
            200,
        ),
        (
            "get",
            "/admin/events/{id}",
            "/admin/events/987654".into(),
            404,
        ),
        (
            "get",
            "/admin/events/{id}/why",
            format!("/admin/events/{failed}/why"),
            200,
        ),
        (
            "post",
            "/admin/events/{id}/retry",
            format!("/admin/events/{sent}/retry"),
            409,
        ),
        (
            "post",
            "/admin/events/retry",
            "/admin/events/retry?dry_run=true".into(),
            200,
        ),
        (
            "post",
            "/admin/events/retry",
            "/admin/events/retry?confirm=7".into(),
            409,
        ),
        (
            "post",
            "/admin/events/replay",
            format!("/admin/events/replay?sent_since={since}&dry_run=true"),
            200,
        ),
        (
            "post",
            "/admin/events/replay",
            format!("/admin/events/replay?sent_since={since}&confirm=9"),
            409,
        ),
        (
            "post",
            "/admin/events/replay",
            "/admin/events/replay?sent_since=2999-01-01T00:00:00Z".into(),
            422,
        ),
        (
            "get",
            "/admin/dispatchers",
            "/admin/dispatchers".into(),
            200,
        ),
        (
            "post",
            "/admin/dispatchers/{name}/pause",
            "/admin/dispatchers/accounts/pause?label=doc".into(),
            200,
        ),
        (
            "post",
            "/admin/dispatchers/{name}/pause",
            "/admin/dispatchers/nope/pause".into(),
            404,
        ),
        (
            "post",
            "/admin/dispatchers/{name}/resume",
            "/admin/dispatchers/accounts/resume".into(),
            202,
        ),
        (
            "post",
            "/admin/events/retrigger",
            format!("/admin/events/retrigger?ids={failed}"),
            202,
        ),
        (
            "post",
            "/admin/events/{id}/retry",
            format!("/admin/events/{failed}/retry"),
            200,
        ),
        (
            "post",
            "/admin/events/replay",
            format!("/admin/events/replay?sent_since={since}&ids={sent}"),
            202,
        ),
        ("get", "/admin/operations", "/admin/operations".into(), 200),
        (
            "get",
            "/admin/operations/{id}",
            "/admin/operations/op-nope".into(),
            404,
        ),
        (
            "delete",
            "/admin/operations/{id}",
            "/admin/operations/op-nope".into(),
            404,
        ),
        (
            "get",
            "/admin/openapi.json",
            "/admin/openapi.json?x=1".into(),
            400,
        ),
    ];
    for (method, path, url, expected) in cases {
        let (status, body) = call(method, path, url.clone()).await;
        assert_eq!(status, expected, "{method} {url}: {body}");
    }
    // An operation's own page and its cancel once it has ended (409).
    let (_, ops) = call("get", "/admin/operations", "/admin/operations".into()).await;
    let id = ops[0]["id"].as_str().unwrap().to_owned();
    eventually("the operation to end", T, || async {
        let (_, op) = call(
            "get",
            "/admin/operations/{id}",
            format!("/admin/operations/{id}"),
        )
        .await;
        (op["state"] != "running").then_some(())
    })
    .await;
    let (status, _) = call(
        "delete",
        "/admin/operations/{id}",
        format!("/admin/operations/{id}"),
    )
    .await;
    assert_eq!(status, 409);
    // Every documented (path, method, status) of a success was met above
    // or is the document itself.
    let r = client
        .get(t.api_url("/admin/openapi.json"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    t.stop().await;
}
