//! The environment that points a sandbox's HTTP clients at its proxy.

/// Environment variables that make common clients (curl, pip, npm, git, requests, urllib, node) use the proxy
/// at `127.0.0.1:port` inside the sandbox: `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY` in upper and
/// lower case, plus `NODE_USE_ENV_PROXY=1` so Node's built-in `fetch` honours them. Loopback is excluded so
/// local servers inside the sandbox stay reachable directly.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let no_proxy = "localhost,127.0.0.1,::1".to_owned();
    let mut env = Vec::new();
    for (name, value) in [("HTTP_PROXY", &url), ("HTTPS_PROXY", &url), ("ALL_PROXY", &url), ("NO_PROXY", &no_proxy)] {
        env.push((name.to_owned(), value.clone()));
        env.push((name.to_ascii_lowercase(), value.clone()));
    }
    env.push(("NODE_USE_ENV_PROXY".to_owned(), "1".to_owned()));
    env
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn sets_both_cases_and_excludes_loopback() {
        let env = proxy_env(3128);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("HTTPS_PROXY"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("http_proxy"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("all_proxy"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("no_proxy"), Some("localhost,127.0.0.1,::1"));
    }
}
