//! The `slotgate` binary: parses the command line, loads the configuration, sets up logging and
//! starts the gateway.

fn main() {}
