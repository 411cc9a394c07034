//! A TCP proxy that can cut a service off: while down it drops every open
//! connection and refuses new ones, as a database outage looks to a client;
//! while blackholed it stops answering on every connection and accepts new
//! ones that never answer either, as a lost network path looks (no reset,
//! no keepalive: the client waits until its own deadline).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    cut: watch::Sender<u64>,
    hole: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let (cut, _) = watch::channel(0u64);
        let (hole, _) = watch::channel(false);
        // Connections caught by the blackhole: open, never answered.
        let held = Arc::new(std::sync::Mutex::new(Vec::new()));
        let task = {
            let down = down.clone();
            let cut = cut.clone();
            let hole = hole.clone();
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if down.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    if *hole.borrow() {
                        held.lock().unwrap().push(inbound);
                        continue;
                    }
                    let mut cut_rx = cut.subscribe();
                    let mut hole_rx = hole.subscribe();
                    let held = held.clone();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(target).await else {
                            return;
                        };
                        let mut inbound = inbound;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = cut_rx.changed() => {}
                            _ = hole_rx.wait_for(|on| *on) => {
                                held.lock().unwrap().push(inbound);
                            }
                        }
                    });
                }
            })
        };
        Proxy {
            addr,
            down,
            cut,
            hole,
            task,
        }
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            self.cut.send_modify(|n| *n += 1);
        }
    }
}

impl Proxy {
    /// Stops answering (connections caught stay silent for good), or lets
    /// new connections through again.
    pub fn set_blackhole(&self, on: bool) {
        self.hole.send_replace(on);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
