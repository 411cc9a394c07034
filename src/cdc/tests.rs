//! Tests of the change-event decoder: unit cases, fixtures and properties.
