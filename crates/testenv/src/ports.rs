//! Free loopback ports.

use std::net::{Ipv4Addr, TcpListener};

use crate::{Error, Result};

/// Asks the kernel for a loopback port that is free right now.
///
/// The port is released before the component binds it, so another process
/// could take it in between; components are started one at a time right after
/// their ports are picked, which keeps that window to milliseconds.
pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(Error::io("binding a loopback port in", "127.0.0.1"))?;
    let port = listener
        .local_addr()
        .map_err(Error::io("reading the address of", "127.0.0.1"))?
        .port();
    Ok(port)
}
