// Package sdnotify implements the client side of systemd's notification
// protocol (sd_notify(3)): one datagram of newline-separated KEY=VALUE
// assignments to the unix socket named by $NOTIFY_SOCKET.
package sdnotify

import (
	"fmt"
	"net"
	"os"
)

// Common states.
const (
	Ready     = "READY=1"
	Stopping  = "STOPPING=1"
	Reloading = "RELOADING=1"
)

// Notify sends state to the service manager. It returns (false, nil) when
// not run under a manager that asked for notifications ($NOTIFY_SOCKET unset).
func Notify(state string) (bool, error) {
	return NotifySocket(os.Getenv("NOTIFY_SOCKET"), state)
}

// NotifySocket sends state to the socket at path; "" means no manager.
// A path starting with "@" names an abstract socket.
func NotifySocket(path, state string) (bool, error) {
	if path == "" {
		return false, nil
	}
	addr := &net.UnixAddr{Name: path, Net: "unixgram"}
	if path[0] == '@' {
		addr.Name = "\x00" + path[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return false, fmt.Errorf("sd_notify: connect to %s: %w", path, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("sd_notify: send %q: %w", state, err)
	}
	return true, nil
}

// Status formats a STATUS= line shown by `systemctl status`.
func Status(format string, args ...any) string {
	return "STATUS=" + fmt.Sprintf(format, args...)
}
