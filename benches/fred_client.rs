//! The bare fred connection the benchmarks measure floors and naive locks on.

use fred::interfaces::ClientLike;

/// A fred client configured like redbaton's command connection (TCP_NODELAY).
pub async fn fred_client(url: &str) -> fred::clients::Client {
    let config = fred::prelude::Config::from_url(url).expect("url");
    let client = fred::prelude::Builder::from_config(config)
        .with_connection_config(|c| {
            c.tcp = fred::types::config::TcpConfig {
                nodelay: Some(true),
                ..Default::default()
            };
        })
        .build()
        .expect("fred client");
    client.init().await.expect("connect");
    client
}

/// CPU time redis-server has used so far (`INFO cpu`: used_cpu_user + used_cpu_sys), in µs.
/// (Not every bench that includes this file uses it.)
#[allow(dead_code)]
pub async fn server_cpu_us(raw: &fred::clients::Client) -> f64 {
    let info: String = raw
        .info(Some(fred::types::InfoKind::Cpu))
        .await
        .expect("INFO cpu");
    info.lines()
        .filter_map(|line| match line.trim().split_once(':')? {
            ("used_cpu_user" | "used_cpu_sys", value) => value.parse::<f64>().ok(),
            _ => None,
        })
        .sum::<f64>()
        * 1e6
}
