package tiering

// Exported for the end-to-end tests in package tiering_test, which drive a
// real broker (importing broker from package tiering itself would be a cycle).
var RunVersitygw = runVersitygw

// FreeAddr returns a loopback address that was free a moment ago.
var FreeAddr = freeAddr

type VersitygwServer = versitygwServer

// Credentials of the test server, for child processes that read the
// standard AWS environment.
const VersitygwAccessKey, VersitygwSecretKey, VersitygwRegion = versitygwAccessKey, versitygwSecretKey, versitygwRegion

// ChunkSize is the alignment of cold-read ranged GETs.
const ChunkSize = chunkSize
