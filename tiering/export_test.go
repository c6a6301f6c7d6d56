package tiering

// Exported for the end-to-end tests in package tiering_test, which drive a
// real broker (importing broker from package tiering itself would be a cycle).
var RunVersitygw = runVersitygw

type VersitygwServer = versitygwServer
