//! The HTTP toolkit the admin API and the console share: request
//! parameters checked by name, a bulk resend's filters and confirmation,
//! and the admin token's comparison.

pub mod params;
pub mod replay;
pub mod resend;
pub mod token;
