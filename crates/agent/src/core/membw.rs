//! The memory-bandwidth relay: a local client's request (`cosched request-membw`, through
//! [`crate::membw`]'s socket) goes to the host as `MEMBW`, and its answer back to that client.

use cosched_proto::{DenyReason, Frame, Kind};

use super::{AgentCore, Out, INFLIGHT};

/// What the host granted a `MEMBW` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MembwGrant {
    pub asked: u64,
    pub granted: u64,
}

impl AgentCore {
    /// A local client asks for a memory-bandwidth share (permille; 0 gives it back). The host's
    /// answer comes back as [`Out::MembwReply`]; without a registration the client is told at once.
    pub fn membw_request(&mut self, share: u64, client: u64, now: u64, out: &mut Vec<Out>) {
        if !self.cfg.membw {
            let result = Err("the memory-bandwidth API is off in this agent".to_string());
            return out.push(Out::MembwReply { client, result });
        }
        if !self.is_registered() {
            let result = Err("the agent is not registered with the host (yet): try again".to_string());
            return out.push(Out::MembwReply { client, result });
        }
        self.membw_wanted = share;
        self.send_membw(share, Some(client), now, out);
    }

    pub(super) fn send_membw(&mut self, share: u64, client: Option<u64>, now: u64, out: &mut Vec<Out>) {
        let seq = self.next_seq();
        if self.membw_pending.len() == INFLIGHT {
            self.membw_pending.remove(0);
        }
        self.membw_pending.push((seq, client, share));
        self.send_request(Frame::new(Kind::Membw, seq, share), now, out);
    }

    /// The host's reply to a `MEMBW`.
    pub(super) fn on_membw_reply(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        let Some(i) = self.membw_pending.iter().position(|p| p.0 == f.seq) else { return };
        let (_, client, asked) = self.membw_pending.remove(i);
        let result = if f.kind == Kind::Ack {
            self.membw_granted = f.value;
            out.push(Out::Log(format!("membw: asked {asked}‰, the host granted {}‰", f.value)));
            Ok(MembwGrant { asked, granted: f.value })
        } else {
            let reason = f.deny_reason();
            if asked == self.membw_wanted {
                self.membw_granted = 0;
            }
            out.push(Out::Log(format!("membw: asked {asked}‰, the host replied {f}")));
            let why = match reason {
                Some(DenyReason::Unsupported) => {
                    "unsupported: the host cannot regulate memory bandwidth (its `cosched status` says why)".to_string()
                }
                Some(DenyReason::Budget) => "budget: the host's guaranteed bandwidth is all given out".to_string(),
                Some(DenyReason::Disabled) => "disabled: the host's operator turned membw off".to_string(),
                Some(r) => r.name().to_string(),
                None => format!("{f}"),
            };
            if reason == Some(DenyReason::NotRegistered) {
                self.on_deny(f, now, out);
            }
            Err(why)
        };
        if let Some(client) = client {
            out.push(Out::MembwReply { client, result });
        }
    }
}
