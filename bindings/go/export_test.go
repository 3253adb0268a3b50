package pymq

// EditReclaimToken (tests only) replaces the re-claim token c would offer at its next reconnection with
// edit(token): a forged token, or another connection's, must be refused by the broker (spec/ha.md §4.7).
func EditReclaimToken(c *Conn, edit func(string) string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reclaimToken = edit(c.reclaimToken)
}

// ReclaimToken (tests only) is the token c would offer at its next reconnection.
func ReclaimToken(c *Conn) string { return c.reclaimTokenNow() }
